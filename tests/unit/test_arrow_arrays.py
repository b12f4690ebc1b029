"""Arrow arrays to numpy and back without pyarrow's pandas bridge (servestack/inference/tabular/arrow_arrays.py):
the same values as pyarrow's own conversions, and a Parquet job's path that never imports pandas."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from servestack.inference.tabular.arrow_arrays import from_numbers, numbers, strings
from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint16", "uint64", "float16", "float32", "float64"])
def test_numbers_are_the_values_of_a_sliced_array_and_of_a_chunked_one(dtype: str) -> None:
    # GIVEN an Arrow array of that type, sliced so that it starts past its buffer's first value
    array = pa.array(np.arange(10).astype(dtype)).slice(3, 5)
    # WHEN it is read as numpy, alone and as two chunks of a chunked array
    alone, chunked = numbers(array), numbers(pa.chunked_array([array, array]))
    # THEN the values and dtype are pyarrow's own conversion's
    expected = array.to_numpy(zero_copy_only=False)
    assert alone.dtype == expected.dtype
    assert alone.tolist() == expected.tolist()
    assert chunked.tolist() == expected.tolist() * 2


def test_booleans_and_strings_go_through_pyarrow() -> None:
    # GIVEN types whose values are not laid out as numpy's: bits, and offsets with bytes
    # WHEN they are read as numpy
    # THEN they come back as pyarrow converts them
    assert numbers(pa.array([True, False, True])).tolist() == [True, False, True]
    assert numbers(pa.array(["a", "b"])).tolist() == ["a", "b"]


def test_from_numbers_keeps_values_and_type_of_strided_and_boolean_arrays() -> None:
    # GIVEN a strided int64 view, a float32 array and a boolean one
    # WHEN each becomes an Arrow array
    # THEN it holds the same values with the numpy dtype's Arrow type, and no nulls
    strided = from_numbers(np.arange(10)[::3])
    assert strided.type == pa.int64()
    assert strided.to_pylist() == [0, 3, 6, 9]
    assert strided.null_count == 0
    assert from_numbers(np.array([1.5, -2], dtype=np.float32)).type == pa.float32()
    assert from_numbers(np.array([True, False])).to_pylist() == [True, False]


def test_strings_are_the_names_as_an_arrow_string_array() -> None:
    # GIVEN names of several lengths, one empty and one not ASCII
    names = ["malignant", "", "benign", "été"]
    # WHEN the column is built from them
    # THEN it is a plain string array of the same names
    built = strings(names)
    assert built.type == pa.string()
    assert built.to_pylist() == names
    assert strings([]).to_pylist() == []


def test_a_parquet_job_imports_neither_pandas_nor_pyarrow_compute() -> None:
    # GIVEN a fresh interpreter with pandas installed WHEN a job reads a float Parquet file, scores it and writes
    # and checks Parquet parts
    code = """
import sys
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from servestack.inference.service import ModelRepository
from servestack.inference.settings import ServingSettings
from servestack.inference.tabular import BatchJob, StoredObject

class MemoryStore:
    def __init__(self, objects):
        self.objects = objects
    def list(self, prefix):
        return [StoredObject(k, len(v), str(len(v))) for k, v in sorted(self.objects.items()) if k.startswith(prefix)]
    def download(self, key, path):
        Path(path).write_bytes(self.objects[key])
    def get(self, key):
        return self.objects[key]
    def metadata(self, key):
        return None
    def put(self, key, body, metadata, *, sha256=None):
        self.objects[key] = bytes(body)
    def delete(self, key):
        self.objects.pop(key, None)

rows = np.random.default_rng(0).uniform(1, 2, (100, 30)).astype(np.float32)
columns = {f"f{i}": pa.Array.from_buffers(pa.float32(), 100, [None, pa.py_buffer(rows[:, i].copy())])
           for i in range(30)}
sink = pa.BufferOutputStream()
pq.write_table(pa.table(columns), sink)
repository = ModelRepository(ServingSettings())
repository.load_all()
job = BatchJob(store=MemoryStore({"in/a.parquet": sink.getvalue().to_pybytes()}), model=repository.get("breast-cancer"),
               input_prefix="in/", output_prefix="out/", output_format="parquet")
manifest = job.run()
print(manifest["rows"]["succeeded"], sorted({"pandas", "pyarrow.compute"} & set(sys.modules)))
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    # THEN every row is scored and neither pandas nor pyarrow.compute was loaded
    assert result.stdout.split("\n")[-2] == "100 []"
