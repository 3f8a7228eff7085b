"""`python -m mesh_tensorflow.plan --picture/--text_picture`, in process."""

import xml.etree.ElementTree as ElementTree

import gin
import pytest

from mesh_tensorflow._src.plan import report

TINY = [
  "--gin_file=models/tiny.gin",
  "--gin_param=utils.run.model_type = 'lm'",
  "--mesh_shape=batch:2;model:2",
  "--layout=batch:batch;vocab:model;d_ff:model",
  "--batch_size=4",
  "--sequence_length=8",
  "--vocab_size=256",
]
EMBEDDING = "transformer/embedding"


@pytest.fixture(autouse=True)
def _clean_gin():
  yield
  gin.clear_config()


def test_picture_of_every_variable(tmp_path, capsys):
  path = tmp_path / "layout.svg"
  assert report.main(TINY + ["--picture=%s" % path]) == 0
  out = capsys.readouterr().out
  count = int(out.split("wrote the layout picture of ")[1].split()[0])
  assert count > 4  # the embedding, norms, attention and feed-forward kernels
  cells = [
    e
    for e in ElementTree.parse(path).getroot().iter()
    if e.get("class") == "cell"
  ]
  assert len(cells) == 4 * count


def test_text_picture_of_chosen_variables(capsys):
  assert report.main(TINY + ["--text_picture", "--tensors=%s" % EMBEDDING]) == 0
  out = capsys.readouterr().out
  block = out[out.index(EMBEDDING + " [") :].splitlines()
  assert block[0] == (
    "transformer/embedding [vocab:256;d_model:128] on mesh batch:2;model:2, "
    "layout vocab:model"
  )
  # Rows are the batch coordinate, columns the model one: the vocabulary is
  # split over model.
  assert [line.split() for line in block[3:5]] == [
    ["batch=0", "A", "B"],
    ["batch=1", "A", "B"],
  ]
  assert block[5:7] == [
    "A  vocab[0:128] d_model[0:128]",
    "B  vocab[128:256] d_model[0:128]",
  ]


def test_unknown_variable_is_an_error(capsys):
  assert report.main(TINY + ["--text_picture", "--tensors=nope"]) == 2
  assert "named ['nope']" in capsys.readouterr().err
