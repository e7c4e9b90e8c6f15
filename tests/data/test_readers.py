"""Tests for flax_xalign.data.sources.readers: POS, NER and sentence-pair files."""

import pytest

from flax_xalign import errors
from flax_xalign.data.sources import readers
CONLLU = """\
# sent_id = 1
# text = Ἐν ἀρχῇ ἦν
1\tἘν\tἐν\tADP\tP\t_\t2\tcase\t_\t_
2\tἀρχῇ\tἀρχή\tNOUN\tN-DSF\t_\t3\tobl\t_\t_
3\tἦν\tεἰμί\tAUX\tV-IAI-3S\t_\t0\troot\t_\t_

1-2\tdel\t_\t_\t_\t_\t_\t_\t_\t_
1\tde\tde\tADP\tSP\t_\t2\tcase\t_\t_
2\tel\tel\tDET\tDA\t_\t0\troot\t_\t_
2.1\tvio\t_\tVERB\t_\t_\t_\t_\t0:root\t_
"""


def write(tmp_path, text, name="data.txt", encoding="utf-8"):
  path = tmp_path / name
  path.write_bytes(text.encode(encoding))
  return path


def test_conllu_pos_reads_upos_and_xpos(tmp_path):
  path = write(tmp_path, CONLLU.replace("\n", "\r\n"), "pos.conllu")
  upos = readers.read_conllu_pos(path)
  assert upos == [
      readers.TaggedSentence(("Ἐν", "ἀρχῇ", "ἦν"), ("ADP", "NOUN", "AUX")),
      readers.TaggedSentence(("de", "el"), ("ADP", "DET")),
  ]
  xpos = readers.read_conllu_pos(path, column="xpos")
  assert xpos[0].tags == ("P", "N-DSF", "V-IAI-3S")
  with pytest.raises(errors.UserError, match="unknown column"):
    readers.read_conllu_pos(path, column="lemma")


@pytest.mark.parametrize("bad_line, message", [
    ("4\tx\tx\tNOUN\t_\t_\t3", ":6: expected 10"),
    ("x\tx\tx\tNOUN\t_\t_\t3\tobj\t_\t_", ":6: ID 'x'"),
    ("4\tx\tx\t_\tN\t_\t3\tobj\t_\t_", ":6: no UPOS tag for 'x'"),
])
def test_conllu_pos_errors_name_the_line(tmp_path, bad_line, message):
  text = CONLLU.split("\n\n")[0] + "\n" + bad_line + "\n"
  path = write(tmp_path, text)
  with pytest.raises(errors.UserError, match=f"{path}{message}"):
    readers.read_conllu_pos(path)


def test_conllu_sentences_type_ids_and_keep_columns_as_written(tmp_path):
  path = write(tmp_path, CONLLU + "\n# note without equals\n"
               "1\ttwo  spaces\t_\tX\t_\tA=B=C|A=D\t_\t_\t_\tSpaceAfter=No\n", "s.conllu")
  first, second, third = readers.read_conllu_sentences(path)
  assert [t["id"] for t in second.tokens] == [(1, "-", 2), 1, 2, (2, ".", 1)]
  assert [readers.is_syntactic_word(t) for t in second.tokens] == [False, True, True, False]
  assert second.line_numbers == (7, 8, 9, 10) and (second.first_line, second.last_line) == (7, 10)
  assert first.comments == ("# sent_id = 1", "# text = Ἐν ἀρχῇ ἦν")
  assert first.tokens.metadata == {"sent_id": "1", "text": "Ἐν ἀρχῇ ἦν"}
  assert (first.first_line, first.last_line) == (1, 5)
  assert first.tokens[1]["xpos"] == "N-DSF" and first.tokens[1]["head"] == "3"
  # A form with two spaces stays one column (conllu's own line split would cut
  # it), and FEATS/MISC stay the text written.
  (word,) = third.tokens
  assert (word["form"], word["feats"], word["misc"]) == ("two  spaces", "A=B=C|A=D", "SpaceAfter=No")
  assert third.comments == ("# note without equals",) and third.line_numbers == (13,)


@pytest.mark.parametrize("bad_id", ["2-1", "a-b", "1.x", "01", "_"])
def test_conllu_malformed_ids_name_the_line(bad_id):
  lines = ["1\ta\t_\tX\t_\t_\t0\troot\t_\t_", f"{bad_id}\tb\t_\tX\t_\t_\t1\tdep\t_\t_"]
  with pytest.raises(errors.UserError, match=f"<lines>:2: ID '{bad_id}' is not an integer"):
    list(readers.read_conllu_sentences(lines))


def test_conllu_checks_run_in_line_order(tmp_path):
  # check_word sees each word as its line is read, before a later line fails;
  # so read_conllu_pos reports a missing tag on line 2 before the short line 3.
  lines = ["1\ta\t_\tX\t_\t_\t0\troot\t_\t_", "2\tb\t_\t_\t_\t_\t1\tdep\t_\t_",
           "3\tc\t_\tX"]
  seen = []
  with pytest.raises(errors.UserError, match=":3: expected 10"):
    list(readers.read_conllu_sentences(
        lines, check_word=lambda t, where, position: seen.append((where, position))))
  assert seen == [("<lines>:1", 1), ("<lines>:2", 2)]
  path = write(tmp_path, "\n".join(lines) + "\n", "order.conllu")
  with pytest.raises(errors.UserError, match=f"{path}:2: no UPOS tag for 'b'"):
    readers.read_conllu_pos(path)


NER = """\
-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter\tB-PER
Blackburn\tI-PER


Paris I-LOC"""


def test_conll_ner(tmp_path):
  sentences = readers.read_conll_ner(write(tmp_path, NER))
  assert sentences == [
      readers.TaggedSentence(("EU", "rejects", "German"),
                             ("B-ORG", "O", "B-MISC")),
      readers.TaggedSentence(("Peter", "Blackburn"), ("B-PER", "I-PER")),
      readers.TaggedSentence(("Paris",), ("I-LOC",)),
  ]


@pytest.mark.parametrize("bad_line, message", [
    ("lonely", ":3: expected `token ... tag`"),
    ("Paris S-LOC", ":3: tag 'S-LOC' is not BIO"),
    ("Paris B-", ":3: tag 'B-' is not BIO"),
])
def test_conll_ner_errors_name_the_line(tmp_path, bad_line, message):
  path = write(tmp_path, f"EU B-ORG\nrejects O\n{bad_line}\n")
  with pytest.raises(errors.UserError, match=f"{path}{message}"):
    readers.read_conll_ner(path)


XNLI = """\
language\tgold_label\tsentence1_binary_parse\tsentence1\tsentence2\tpairID
en\tneutral\t( ( x ) )\tHe said, "Mom, I'm home."\tHe didn't say a word.\t1
en\tcontradiction\t( ( y ) )\tOne\tTwo\t2

"""


def test_xnli_tsv_with_header(tmp_path):
  examples = readers.read_xnli_tsv(write(tmp_path, XNLI))
  assert examples == [
      readers.SentencePairExample('He said, "Mom, I\'m home."',
                                  "He didn't say a word.", "neutral"),
      readers.SentencePairExample("One", "Two", "contradiction"),
  ]
  renamed = readers.read_xnli_tsv(
      write(tmp_path, XNLI), premise_column="sentence2",
      hypothesis_column="sentence1", label_column="language")
  assert renamed[1] == readers.SentencePairExample("Two", "One", "en")


def test_xnli_tsv_headerless(tmp_path):
  path = write(tmp_path, "a b\tc d\tentailment\ne\tf\tneutral\n")
  assert readers.read_xnli_tsv(path, has_header=False) == [
      readers.SentencePairExample("a b", "c d", "entailment"),
      readers.SentencePairExample("e", "f", "neutral"),
  ]
  with pytest.raises(errors.UserError, match=f"{path}:1: the header"):
    readers.read_xnli_tsv(path)


def test_xnli_tsv_errors_name_the_line(tmp_path):
  path = write(tmp_path, XNLI + "en\tneutral\tp\tonly premise\n")
  with pytest.raises(errors.UserError,
                     match=f"{path}:5: expected 6 tab-separated fields, "
                     "found 4"):
    readers.read_xnli_tsv(path)
  path = write(tmp_path, "a\tb\t \n")
  with pytest.raises(errors.UserError, match=f"{path}:1: empty label"):
    readers.read_xnli_tsv(path, has_header=False)
  path = write(tmp_path, "a\tb\n")
  with pytest.raises(errors.UserError, match="headerless"):
    readers.read_xnli_tsv(path, has_header=False)


def test_file_errors(tmp_path):
  with pytest.raises(errors.UserError, match="no such file"):
    readers.read_conll_ner(tmp_path / "missing.txt")
  with pytest.raises(errors.UserError, match="is a directory"):
    readers.read_conll_ner(tmp_path)
  path = write(tmp_path, "EU B-ORG\nrejects O\n\xe9t\xe9 O\n",
               encoding="latin-1")
  with pytest.raises(errors.UserError, match=f"{path}:3: not valid UTF-8"):
    readers.read_conll_ner(path)


def test_the_column_names_are_conllus_own():
  # readers names the ten columns itself so that importing it needs no conllu (a bare GPU host trains).
  import conllu.parser

  assert readers.CONLLU_FIELDS == tuple(conllu.parser.DEFAULT_FIELDS)
