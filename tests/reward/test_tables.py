"""The table reader's refusals for files datasets reads only with a traceback: a damaged .gz, a table without
rows, a corrupt parquet file, an empty path. Each names the setting, the file and what was expected."""

import gzip
import json
import re

import pytest

from reward.refusals import ConfigError, InputError
from reward.tables import read_table

ROWS = "".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(200))


def truncated(name: str, text: str):
    """A gzip file cut off half-way, as an interrupted download leaves it."""
    def write(path):
        whole = gzip.compress(text.encode())
        path.write_bytes(whole[:len(whole) // 2])
    return name, write


@pytest.mark.parametrize("name, write, problem", [
    (*truncated("trunc.jsonl.gz", ROWS),
     r"the gzip stream ends early \(a truncated download\?\); expected a complete gzip file of JSON lines$"),
    (*truncated("trunc.json.gz", json.dumps([{"prompt": f"prompt {i}"} for i in range(200)])),
     r"the gzip stream ends early \(a truncated download\?\); expected a complete gzip file of JSON$"),
    ("plain.jsonl.gz", lambda path: path.write_text(ROWS),
     r"not gzip data \(.*\); expected a gzip file of JSON lines, or the name without \.gz"),
    ("empty.json", lambda path: path.write_text("[]"), r"no rows; expected one prompt per row$"),
    ("header.csv", lambda path: path.write_text("prompt,id\n"), r"no rows; expected one prompt per row$"),
    ("corrupt.parquet", lambda path: path.write_bytes(b"PAR1 not really parquet"),
     r"could not be read as a \.parquet table \(ArrowInvalid\(.*\); expected one prompt per row$"),
])
@pytest.mark.parametrize("setting", ["data.path", "reward.data.path"])
def test_a_damaged_or_empty_table_names_setting_file_and_problem(tmp_path, name, write, problem, setting):
    path = tmp_path / name
    write(path)
    with pytest.raises(InputError, match=rf"^{re.escape(f'{setting}={str(path)!r}')}: {problem}"):
        read_table(setting, str(path), "one prompt per row")


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_path_is_not_read_as_the_working_directory(path):
    with pytest.raises(ConfigError, match=rf"^data\.path='{path}': the path is empty; expected a \.csv, .* file "
                                          r"\(optionally \.gz\), a datasets\.save_to_disk folder or a hub dataset"):
        read_table("data.path", path, "one prompt per row")
