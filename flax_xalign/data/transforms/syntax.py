"""Dependency trees (CoNLL-U) and the syntax transformation T_syn.

T_syn changes a language's word order the way Galactic Dependencies (Wang and
Eisner, 2016) does for ALIGN-MLM / MultilingualAnalysis: it re-linearises the
dependency tree of every sentence, placing chosen dependents on the other side
of their heads (subject-verb-object order, adjective-noun order). It reorders
words only; labels attached to words move with them (see `synthetic.py`).

Bringing parses. No parser runs here (none is available offline, and parsing
is slow): parse your corpus once with any Universal Dependencies parser, e.g.

  Stanza:  stanza.Pipeline("grc", processors="tokenize,pos,lemma,depparse",
                           tokenize_pretokenized=True)  ->  doc to CoNLL-U
  UDPipe:  udpipe --tag --parse --input=horizontal model.udpipe corpus.txt

and pass the CoNLL-U file to `read_conllu`. Feed the parser your own
tokenisation (one sentence per line, words separated by spaces: Stanza's
`tokenize_pretokenized`, UDPipe's `--input=horizontal`) so that token i of a
parse is word i of the sentence it belongs to. Only ID, FORM, UPOS, HEAD and
DEPREL are used by the transform; the other columns are carried along.
Multiword-token ranges (`1-2`) and empty nodes (`1.1`) are skipped on reading.

The reordering (`reorder`), for each head in the tree:

* subject = dependents whose DEPREL (subtype ignored) is nsubj or csubj, on
  any head; object = obj, iobj, ccomp, xcomp, on any head; adjective = amod
  whose head's UPOS is NOUN or PROPN.
* With probability `spec.probability` (one draw per head, from `rng`; a head
  that loses the draw keeps its original order) the subject, object and
  adjective dependents are put on the side the spec asks for. A dependent
  that changes side is placed next to the head (so SVO -> SOV gives S O V, and
  SVO -> VSO gives V S O), keeping the original order among those that moved;
  all other dependents keep their side and relative order.
* Each dependent carries its whole subtree (projective linearisation).

Non-projective trees (crossing arcs, common in Greek hyperbaton) are made
projective first by lifting: the shortest non-projective arc is re-attached
to the head's head until none is left (Nivre and Nilsson, 2005). The original
order is a linearisation of the lifted tree, so a sentence where no head is
reordered (e.g. `probability=0`) keeps its order exactly. A lifted dependent
no longer plays its role (it is not the subject/object of its new head) and
keeps its side. `is_projective` tells which sentences needed lifting, for
those who prefer to drop them, as MultilingualAnalysis did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import dataclasses
import os
from typing import TYPE_CHECKING, NamedTuple, Union

import numpy as np

from flax_xalign import errors
from flax_xalign.data.sources import readers
from flax_xalign.fileio import write_atomically

if TYPE_CHECKING:
  import conllu  # (imported where a head is parsed: see data/sources/readers.py)

CONLLU_COLUMNS = readers.CONLLU_COLUMNS
SUBJECT_RELATIONS = frozenset({"nsubj", "csubj"})
OBJECT_RELATIONS = frozenset({"obj", "iobj", "ccomp", "xcomp"})
ADJECTIVE_RELATIONS = frozenset({"amod"})
NOMINAL_HEADS = frozenset({"NOUN", "PROPN"})
_LEFT, _RIGHT = "left", "right"


class Token(NamedTuple):
  """One syntactic word of a CoNLL-U sentence.

  Attributes:
    index: the 1-based CoNLL-U ID.
    form: the word.
    upos: the universal POS tag.
    head: the ID of the head, 0 for the root.
    deprel: the dependency relation to the head (with any `:subtype`).
    feats: FEATS, carried along.
    misc: MISC, carried along.
    lemma: LEMMA, carried along.
    xpos: XPOS, carried along.
    deps: DEPS (enhanced graph), carried along.
  """
  index: int
  form: str
  upos: str
  head: int
  deprel: str
  feats: str = "_"
  misc: str = "_"
  lemma: str = "_"
  xpos: str = "_"
  deps: str = "_"


class Sentence(NamedTuple):
  """A dependency-parsed sentence.

  Attributes:
    tokens: the words, `tokens[i].index == i + 1`.
    comments: the comment lines before the sentence, `#` included.
  """
  tokens: tuple[Token, ...]
  comments: tuple[str, ...] = ()


# ------------------------------------------------------------------- CoNLL-U


def _sentence_name(sentence: Sentence) -> str:
  for comment in sentence.comments:
    key, _, value = comment.lstrip("# ").partition("=")
    if key.strip() == "sent_id":
      return f"sentence {value.strip()!r}"
  words = " ".join(t.form for t in sentence.tokens[:6])
  return f"sentence {words!r}" + ("..." if len(sentence.tokens) > 6 else "")


def _check_tree(tokens: Sequence[Token], where: str) -> None:
  """Raises UserError unless `tokens` are numbered 1..n and form a tree."""
  n = len(tokens)
  for position, token in enumerate(tokens, start=1):
    if token.index != position:
      raise errors.UserError(
          f"{where}: word {position} has ID {token.index}; IDs must run "
          "1, 2, ... in order.")
    if not 0 <= token.head <= n:
      raise errors.UserError(
          f"{where}: word {position} ({token.form!r}) has HEAD {token.head} "
          f"outside 0..{n}.")
  reaches_root = [False] * (n + 1)
  reaches_root[0] = True
  for start in range(1, n + 1):
    path, node = [], start
    while not reaches_root[node]:
      if node in path:
        raise errors.UserError(
            f"{where}: the HEAD column has a cycle through word {node} "
            f"({tokens[node - 1].form!r}); every word must lead to the "
            "root (HEAD 0).")
      path.append(node)
      node = tokens[node - 1].head
    for node in path:
      reaches_root[node] = True


def _head(token: conllu.Token, where: str) -> int:
  import conllu.exceptions
  import conllu.parser

  # conllu reads HEAD `_` as None; the transform needs every head.
  try:
    head = conllu.parser.parse_int_value(token["head"])
  except conllu.exceptions.ParseException:
    head = None
  if head is None or head < 0:
    raise errors.UserError(
        f"{where}: HEAD {token['head']!r} of {token['form']!r} is not an "
        "integer; the syntax transform needs a full dependency parse (HEAD 0 "
        "for the root).")
  return head


def _check_word(token: conllu.Token, where: str, position: int) -> None:
  _head(token, where)
  if token["id"] != position:
    raise errors.UserError(
        f"{where}: ID {token['id']} follows {position - 1}; IDs must run "
        "1, 2, ... within a sentence (is a blank line missing?).")


def read_conllu(path_or_lines: Union[str, os.PathLike, Iterable[str]]
                ) -> list[Sentence]:
  """Reads dependency-parsed sentences from CoNLL-U.

  Parsed by `readers.read_conllu_sentences` (the `conllu` package, with
  file:line errors); this adds the HEAD column and the tree checks.

  Args:
    path_or_lines: a file path, or an iterable of lines (e.g. a list of
      strings; named `<lines>` in error messages).

  Returns:
    The sentences in order, without multiword ranges and empty nodes.

  Raises:
    UserError: naming the file and line, for a line without 10 tab-separated
      columns, an empty column, a non-integer ID or HEAD, IDs out of order, a
      HEAD out of range or a cycle.
  """
  name = (os.fspath(path_or_lines) if isinstance(path_or_lines, (str, os.PathLike))
          else "<lines>")
  sentences = []
  for block in readers.read_conllu_sentences(
      path_or_lines, allow_empty_columns=False, check_word=_check_word):
    tokens = tuple(
        Token(t["id"], t["form"], t["upos"], _head(t, name), t["deprel"], t["feats"],
              t["misc"], t["lemma"], t["xpos"], t["deps"])
        for t in block.tokens if readers.is_syntactic_word(t))
    if not tokens:
      raise errors.UserError(
          f"{name}:{block.first_line}: comment lines with no words after them; "
          "every sentence needs at least one word line.")
    _check_tree(tokens, f"{name}:{block.first_line}-{block.last_line} (the sentence)")
    sentences.append(Sentence(tokens, block.comments))
  return sentences


def write_conllu(sentences: Iterable[Sentence],
                 path: Union[str, os.PathLike]) -> None:
  """Writes sentences as CoNLL-U (UTF-8, a blank line after each sentence).

  Args:
    sentences: the sentences.
    path: the output file.

  Raises:
    ValueError: a field contains a tab or a line break, or is empty.
  """
  # Not conllu's serializer: it rebuilds comments from the parsed metadata as
  # `# key = value` (dropping comments without `=`), so a file read and written
  # back would change, and it writes tabs and line breaks inside fields.
  lines = []
  for sentence in sentences:
    lines.extend(sentence.comments)
    for t in sentence.tokens:
      fields = [str(t.index), t.form, t.lemma, t.upos, t.xpos, t.feats,
                str(t.head), t.deprel, t.deps, t.misc]
      for field in fields:
        if not field or any(c in field for c in "\t\n\r"):
          raise ValueError(
              f"write_conllu: bad field {field!r} in word {t.index} of "
              f"{_sentence_name(sentence)}.")
      lines.append("\t".join(fields))
    lines.append("")
  write_atomically(path, "".join(line + "\n" for line in lines))


def apply_permutation(sentence: Sentence, perm: Sequence[int]) -> Sentence:
  """Reorders a sentence's words, renumbering IDs and HEADs.

  A `# text = ...` comment is rewritten as the reordered forms joined by
  spaces; other comments and columns (MISC `SpaceAfter` included) are kept.

  Args:
    sentence: the sentence.
    perm: new position k holds old word `perm[k]` (0-based).

  Returns:
    The reordered sentence; its tree is the same tree.
  """
  n = len(sentence.tokens)
  if sorted(perm) != list(range(n)):
    raise ValueError(f"apply_permutation: {list(perm)} is not a permutation "
                     f"of 0..{n - 1}.")
  new_index = {0: 0}
  for k, old in enumerate(perm):
    new_index[old + 1] = k + 1
  tokens = tuple(sentence.tokens[old]._replace(
      index=k + 1, head=new_index[sentence.tokens[old].head])
                 for k, old in enumerate(perm))
  text = "# text = " + " ".join(t.form for t in tokens)
  comments = tuple(text if c.startswith("# text =") else c
                   for c in sentence.comments)
  return Sentence(tokens, comments)


# ----------------------------------------------------------- the reordering


@dataclasses.dataclass(frozen=True)
class ReorderSpec:
  """The target word order of T_syn.

  Every field always applies (there is no "keep"): `from_string` fills the
  parts a string leaves out with these defaults, French-like SVO and NA, the
  target of the ALIGN-MLM paper.

  Attributes:
    verb_object: "VO" or "OV": the object's side of its head.
    subject_verb: "SV" or "VS": the subject's side of its head.
    adjective_noun: "AN" (adjective before the noun) or "NA".
    probability: each head is reordered with this probability, one draw per
      head (Galactic Dependencies samples its orders too); 0 keeps every
      sentence as it is.
  """
  verb_object: str = "VO"
  subject_verb: str = "SV"
  adjective_noun: str = "NA"
  probability: float = 1.0

  def __post_init__(self):
    for field, allowed in (("verb_object", ("VO", "OV")),
                           ("subject_verb", ("SV", "VS")),
                           ("adjective_noun", ("AN", "NA"))):
      if getattr(self, field) not in allowed:
        raise errors.UserError(
            f"ReorderSpec: {field}={getattr(self, field)!r}; use one of "
            f"{allowed}.")
    if not 0.0 <= self.probability <= 1.0:
      raise errors.UserError(
          f"ReorderSpec: probability={self.probability} is outside [0, 1].")

  @classmethod
  def from_string(cls, s: str) -> "ReorderSpec":
    """Parses e.g. "SOV", "SOV,AN", "VSO,NA@0.8", "AN@0.5" (case-insensitive).

    A clause order is one of SVO, SOV, VSO, OVS (the side of the subject and
    of the object relative to the verb); VOS and OSV are refused, since a spec
    sets only those sides and a dependent that moves is placed next to its
    head. `@p` sets the probability.
    """
    order, at, probability = s.strip().partition("@")
    kwargs = {}
    if at:
      try:
        kwargs["probability"] = float(probability)
      except ValueError:
        raise errors.UserError(
            f"ReorderSpec {s!r}: {probability!r} after @ is not a number; "
            "write e.g. 'SOV@0.8'.") from None
    parts = [p.strip().upper() for p in order.split(",") if p.strip()]
    if not parts:
      raise errors.UserError(
          f"ReorderSpec {s!r} names no order; write e.g. 'SOV', 'SOV,AN' or "
          "'VSO,NA@0.8'.")
    for part in parts:
      key = "adjective_noun" if part in ("AN", "NA") else "clause"
      if key in kwargs or (key == "clause" and "verb_object" in kwargs):
        raise errors.UserError(f"ReorderSpec {s!r}: {part} is given twice.")
      if key == "adjective_noun":
        kwargs[key] = part
      elif part in ("SVO", "SOV", "VSO", "OVS"):
        kwargs["subject_verb"] = "SV" if part.index("S") < part.index(
            "V") else "VS"
        kwargs["verb_object"] = "VO" if part.index("V") < part.index(
            "O") else "OV"
      elif part in ("VOS", "OSV"):
        raise errors.UserError(
            f"ReorderSpec {s!r}: {part} cannot be expressed: a spec sets "
            "the subject's and the object's side of the verb, and moved "
            "dependents go next to it (use VSO or SOV).")
      else:
        raise errors.UserError(
            f"ReorderSpec {s!r}: unknown part {part!r}; use a clause order "
            "(SVO, SOV, VSO, OVS), an adjective order (AN, NA), and "
            "optionally @probability.")
    return cls(**kwargs)

  def to_string(self) -> str:
    """The canonical string, e.g. "SOV,AN@0.8"; `from_string` reads it back."""
    clause = {("SV", "VO"): "SVO", ("SV", "OV"): "SOV", ("VS", "VO"): "VSO",
              ("VS", "OV"): "OVS"}[self.subject_verb, self.verb_object]
    return f"{clause},{self.adjective_noun}@{self.probability:g}"

  def target_side(self, role: str) -> str:
    """`"left"` or `"right"` of its head for a "subject", "object", "adjective".
    """
    if role == "subject":
      return _LEFT if self.subject_verb == "SV" else _RIGHT
    if role == "object":
      return _RIGHT if self.verb_object == "VO" else _LEFT
    return _LEFT if self.adjective_noun == "AN" else _RIGHT


def _role(dependent: Token, head: Token) -> Union[str, None]:
  relation = dependent.deprel.split(":")[0]
  if relation in SUBJECT_RELATIONS:
    return "subject"
  if relation in OBJECT_RELATIONS:
    return "object"
  if relation in ADJECTIVE_RELATIONS and head.upos in NOMINAL_HEADS:
    return "adjective"
  return None


def _ancestors(heads: Sequence[int]) -> list[set[int]]:
  """`result[i]`: the ancestors of word i (1-based; 0 is the virtual root)."""
  result = [set()]
  for word in range(1, len(heads) + 1):
    found, node = set(), word
    while node:
      node = heads[node - 1]
      found.add(node)
    result.append(found)
  return result


def _non_projective_arcs(heads: Sequence[int]) -> list[int]:
  """The dependents whose arc to their head crosses another arc."""
  ancestors = _ancestors(heads)
  return [d for d, h in enumerate(heads, start=1)
          if any(h not in ancestors[k]
                 for k in range(min(h, d) + 1, max(h, d)))]


def projective_heads(sentence: Sentence) -> tuple[list[int], set[int]]:
  """The HEAD column made projective by lifting, and the lifted words.

  Returns:
    `(heads, lifted)`: `heads[i - 1]` is word i's head after lifting, and
    `lifted` the (1-based) words that were re-attached.

  Raises:
    UserError: the IDs or HEADs do not form a tree.
  """
  _check_tree(sentence.tokens, _sentence_name(sentence))
  heads = [t.head for t in sentence.tokens]
  lifted = set()
  while True:
    crossing = _non_projective_arcs(heads)
    if not crossing:
      return heads, lifted
    word = min(crossing, key=lambda d: (abs(heads[d - 1] - d), d))
    heads[word - 1] = heads[heads[word - 1] - 1]
    lifted.add(word)


def is_projective(sentence: Sentence) -> bool:
  """Whether no arc of the tree crosses another (no lifting is needed)."""
  _check_tree(sentence.tokens, _sentence_name(sentence))
  return not _non_projective_arcs([t.head for t in sentence.tokens])


def reorder(sentence: Sentence, spec: ReorderSpec, *,
            rng: np.random.Generator) -> list[int]:
  """Samples the T_syn word order of one sentence (see the module docstring).

  Args:
    sentence: the parsed sentence.
    spec: the target order.
    rng: draws one number per word (whatever the spec), so a fixed seed gives
      a fixed order.

  Returns:
    A permutation of `range(len(sentence.tokens))`: new position k holds old
    word `perm[k]`.

  Raises:
    UserError: the IDs or HEADs do not form a tree.
  """
  tokens = sentence.tokens
  _check_tree(tokens, _sentence_name(sentence))
  n = len(tokens)
  reordered = rng.random(n) < spec.probability
  heads, lifted = projective_heads(sentence)
  children = [[] for _ in range(n + 1)]
  for word, head in enumerate(heads, start=1):
    children[head].append(word)

  sides = {}  # head -> (left dependents, right dependents), near head inward.
  for head in range(n + 1):
    stay_left, stay_right, to_left, to_right = [], [], [], []
    for child in children[head]:
      side = _LEFT if child < head else _RIGHT
      role = None
      if head and reordered[head - 1] and child not in lifted:
        role = _role(tokens[child - 1], tokens[head - 1])
      target = spec.target_side(role) if role else side
      if target == side:
        (stay_left if side == _LEFT else stay_right).append(child)
      else:
        (to_left if target == _LEFT else to_right).append(child)
    sides[head] = (stay_left + to_left, to_right + stay_right)

  order = []
  stack = [("node", 0)]
  while stack:
    kind, item = stack.pop()
    if kind == "word":
      order.append(item - 1)
      continue
    left, right = sides[item]
    stack.extend(("node", c) for c in reversed(right))
    if item:
      stack.append(("word", item))
    stack.extend(("node", c) for c in reversed(left))
  return order
