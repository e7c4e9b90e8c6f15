"""Tests for flax_xalign.data.transforms.syntax: CoNLL-U and the T_syn reordering."""

import numpy as np
import pytest

from flax_xalign import errors
from flax_xalign.data.transforms import syntax
def conllu(rows, comments=()):
  """CoNLL-U lines from (form, upos, head, deprel) rows."""
  lines = list(comments)
  for i, (form, upos, head, deprel) in enumerate(rows, start=1):
    lines.append(f"{i}\t{form}\t{form}\t{upos}\t_\t_\t{head}\t{deprel}\t_\t_")
  return lines + [""]


# "the big dog sees a cat": AN, SVO.
DOG = [("the", "DET", 3, "det"), ("big", "ADJ", 3, "amod"),
       ("dog", "NOUN", 4, "nsubj"), ("sees", "VERB", 0, "root"),
       ("a", "DET", 6, "det"), ("cat", "NOUN", 4, "obj")]
# "the dog sees a small cat that sleeps ." -- the object has a subtree.
CAT = [("the", "DET", 2, "det"), ("dog", "NOUN", 3, "nsubj"),
       ("sees", "VERB", 0, "root"), ("a", "DET", 6, "det"),
       ("small", "ADJ", 6, "amod"), ("cat", "NOUN", 3, "obj"),
       ("that", "PRON", 8, "nsubj"), ("sleeps", "VERB", 6, "acl:relcl"),
       (".", "PUNCT", 3, "punct")]


def sentence(rows):
  (parsed,) = syntax.read_conllu(conllu(rows))
  return parsed


def reordered(rows, spec, seed=0):
  s = sentence(rows)
  perm = syntax.reorder(s, syntax.ReorderSpec.from_string(spec),
                        rng=np.random.default_rng(seed))
  assert sorted(perm) == list(range(len(rows)))
  return " ".join(s.tokens[i].form for i in perm)


@pytest.mark.parametrize("spec, expected", [
    ("SVO,AN", "the big dog sees a cat"),
    ("SOV,AN", "the big dog a cat sees"),
    ("VSO,AN", "sees the big dog a cat"),
    ("OVS,AN", "a cat sees the big dog"),
    ("SVO,NA", "the dog big sees a cat"),
    ("SOV", "the dog big a cat sees"),  # NA is the default.
])
def test_clause_and_adjective_orders(spec, expected):
  assert reordered(DOG, spec) == expected


def test_subtrees_move_as_units():
  assert (reordered(CAT, "SOV,AN") ==
          "the dog a small cat that sleeps sees .")
  # Every head is reordered: the relative clause's subject moves too.
  assert (reordered(CAT, "VSO,NA") ==
          "sees the dog a cat small sleeps that .")


def test_probability_zero_is_identity_and_draws_are_seeded():
  assert reordered(CAT, "SOV,AN@0") == "the dog sees a small cat that sleeps ."
  outputs = {reordered(CAT, "SOV,NA@0.5", seed) for seed in range(12)}
  assert len(outputs) > 1
  assert reordered(CAT, "SOV,NA@0.5", 3) == reordered(CAT, "SOV,NA@0.5", 3)


def test_amod_only_under_nominal_heads():
  rows = [("runs", "VERB", 0, "root"), ("fast", "ADJ", 1, "amod")]
  assert reordered(rows, "SVO,AN") == "runs fast"


def test_non_projective_tree_is_lifted_consistently():
  # "issue" hangs from "hearing" across "is", which hangs from "scheduled":
  # crossing arcs; lifting re-attaches "issue" to "scheduled".
  rows = [("A", "DET", 2, "det"), ("hearing", "NOUN", 5, "nsubj"),
          ("is", "AUX", 5, "aux"), ("issue", "NOUN", 2, "nmod"),
          ("scheduled", "VERB", 0, "root"), ("today", "ADV", 5, "advmod")]
  s = sentence(rows)
  assert not syntax.is_projective(s)
  heads, lifted = syntax.projective_heads(s)
  assert lifted == {4} and heads[3] == 5
  assert reordered(rows, "SOV@0") == "A hearing is issue scheduled today"
  out = syntax.apply_permutation(
      s, syntax.reorder(s, syntax.ReorderSpec.from_string("VSO"),
                        rng=np.random.default_rng(0)))
  assert " ".join(t.form for t in out.tokens) == (
      "is issue scheduled A hearing today")


def random_tree(rng, n):
  relations = ["nsubj", "obj", "amod", "det", "obl", "iobj", "xcomp"]
  heads = [0] * n
  order = rng.permutation(n) + 1
  for k in range(1, n):
    heads[order[k] - 1] = int(order[rng.integers(k)])
  rows = [(f"w{i}", "NOUN" if i % 2 else "VERB", heads[i - 1],
           "root" if heads[i - 1] == 0 else relations[rng.integers(7)])
          for i in range(1, n + 1)]
  return sentence(rows)


@pytest.mark.parametrize("seed", range(8))
def test_random_trees_give_projective_permutations(seed):
  rng = np.random.default_rng(seed)
  s = random_tree(rng, int(rng.integers(1, 14)))
  spec = syntax.ReorderSpec.from_string("OVS,AN@0.7")
  perm = syntax.reorder(s, spec, rng=np.random.default_rng(seed))
  assert sorted(perm) == list(range(len(s.tokens)))
  # Every subtree of the (lifted) tree is contiguous in the new order.
  heads, _ = syntax.projective_heads(s)
  lifted = s._replace(tokens=tuple(
      t._replace(head=h) for t, h in zip(s.tokens, heads)))
  assert syntax.is_projective(lifted)
  assert syntax.is_projective(syntax.apply_permutation(lifted, perm))
  identity = syntax.reorder(s, syntax.ReorderSpec(probability=0.0),
                            rng=np.random.default_rng(seed))
  assert identity == list(range(len(s.tokens)))


def test_apply_permutation_keeps_the_tree():
  s = sentence(DOG)
  s = s._replace(comments=("# sent_id = 7", "# text = the big dog sees a cat"))
  out = syntax.apply_permutation(s, [3, 5, 4, 0, 1, 2])
  assert [t.index for t in out.tokens] == [1, 2, 3, 4, 5, 6]
  assert out.comments == ("# sent_id = 7", "# text = sees cat a the big dog")

  def arcs(x):
    forms = {t.index: t.form for t in x.tokens}
    return {(t.form, forms.get(t.head, "ROOT"), t.deprel) for t in x.tokens}
  assert arcs(out) == arcs(s)
  with pytest.raises(ValueError):
    syntax.apply_permutation(s, [0, 0, 1, 2, 3, 4])


def test_read_skips_ranges_and_empty_nodes_and_round_trips(tmp_path):
  lines = [
      "# sent_id = a",
      "1-2\tdel\t_\t_\t_\t_\t_\t_\t_\t_",
      "1\tde\tde\tADP\tP\t_\t2\tcase\t_\t_",
      "2\tel\tel\tDET\tD\tDefinite=Def\t0\troot\t_\tSpaceAfter=No",
      "2.1\tx\t_\t_\t_\t_\t_\t_\t1:dep\t_",
      "",
      "1\tλόγος\tλόγος\tNOUN\tN-NSM\t_\t0\troot\t_\t_",
  ]
  first, second = syntax.read_conllu(lines)
  assert [t.form for t in first.tokens] == ["de", "el"]
  assert first.comments == ("# sent_id = a",)
  assert first.tokens[1] == syntax.Token(
      2, "el", "DET", 0, "root", "Definite=Def", "SpaceAfter=No", "el", "D")
  assert second.tokens[0].xpos == "N-NSM"
  path = tmp_path / "out.conllu"
  syntax.write_conllu([first, second], path)
  assert syntax.read_conllu(path) == [first, second]
  assert syntax.read_conllu(str(path)) == [first, second]


def test_write_gives_back_the_bytes_read(tmp_path):
  # Comments without `=` and FEATS/MISC that a dict would rewrite survive a
  # read and a write unchanged (conllu's serializer would not keep them).
  text = ("# sent_id = s1\n# a note\n"
          "1\tde\tde\tADP\tP\tA=B=C|A=D\t2\tcase\t2:case\tSpaceAfter=No\n"
          "2\tel\tel\tDET\tD\t_\t0\troot\t0:root\tGloss=the|Gloss=a\n\n")
  source = tmp_path / "in.conllu"
  source.write_text(text, encoding="utf-8")
  out = tmp_path / "out.conllu"
  syntax.write_conllu(syntax.read_conllu(source), out)
  assert out.read_bytes() == text.encode("utf-8")


@pytest.mark.parametrize("bad_line, message", [
    ("3\tx\tx\tNOUN\t_\t_\t1\tobj\t_", "<lines>:4: expected 10"),
    ("3\tx\tx\tNOUN\t_\t_\tone\tobj\t_\t_", "<lines>:4: HEAD 'one'"),
    ("3\tx\tx\tNOUN\t_\t_\t9\tobj\t_\t_", "HEAD 9 outside 0..3"),
    ("4\tx\tx\tNOUN\t_\t_\t1\tobj\t_\t_", "<lines>:4: ID 4 follows 2"),
    ("3\tx\tx\tNOUN\t_\t\t1\tobj\t_\t_", "<lines>:4: column 6 is empty"),
    ("x\tx\tx\tNOUN\t_\t_\t1\tobj\t_\t_", "<lines>:4: ID 'x'"),
    ("3\tx\tx\tNOUN\t_\t_\t_\tobj\t_\t_", "<lines>:4: HEAD '_' of 'x'"),
    ("3\tx\tx\tNOUN\t_\t_\t-1\tobj\t_\t_", "<lines>:4: HEAD '-1' of 'x'"),
    ("2-1\tx\t_\t_\t_\t_\t_\t_\t_\t_", "<lines>:4: ID '2-1'"),
])
def test_read_errors_name_the_line(bad_line, message):
  lines = ["# sent_id = 1", "1\ta\ta\tDET\t_\t_\t2\tdet\t_\t_",
           "2\tb\tb\tNOUN\t_\t_\t0\troot\t_\t_", bad_line, ""]
  with pytest.raises(errors.UserError, match=message):
    syntax.read_conllu(lines)


def test_read_errors_on_cycles_and_in_files(tmp_path):
  lines = conllu([("a", "X", 2, "dep"), ("b", "X", 1, "dep")])
  with pytest.raises(errors.UserError, match=r"<lines>:1-2 .*cycle"):
    syntax.read_conllu(lines)
  path = tmp_path / "bad.conllu"
  path.write_text("\n".join(conllu(DOG) + ["1 a a DET _ _ 0 root _ _"]))
  with pytest.raises(errors.UserError, match=f"{path}:8: expected 10"):
    syntax.read_conllu(path)
  with pytest.raises(errors.UserError, match="no such file"):
    syntax.read_conllu(tmp_path / "missing.conllu")
  with pytest.raises(errors.UserError, match="no words"):
    syntax.read_conllu(["# only a comment"])


def test_spec_strings():
  spec = syntax.ReorderSpec.from_string(" sov, an @0.8")
  assert spec == syntax.ReorderSpec("OV", "SV", "AN", 0.8)
  assert syntax.ReorderSpec.from_string(spec.to_string()) == spec
  assert syntax.ReorderSpec.from_string("VSO") == syntax.ReorderSpec(
      "VO", "VS", "NA", 1.0)
  assert syntax.ReorderSpec.from_string("AN").verb_object == "VO"
  for bad, message in [("VOS", "cannot be expressed"), ("SOV,VSO", "twice"),
                       ("SXV", "unknown part"), ("SOV@x", "not a number"),
                       ("SOV@1.5", "outside"), ("", "names no order")]:
    with pytest.raises(errors.UserError, match=message):
      syntax.ReorderSpec.from_string(bad)
  with pytest.raises(errors.UserError, match="verb_object"):
    syntax.ReorderSpec(verb_object="OVX")
