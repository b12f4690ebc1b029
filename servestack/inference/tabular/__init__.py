"""Batch scoring of row files (JSON Lines, CSV, Parquet) in bounded chunks, in parts that make a run resumable.

Transport-free: rows come from, and parts go to, a `Store` (S3 in servestack/adapters/batch.py, a folder in tests).
- Input: every `*.jsonl|*.ndjson|*.json` (one instance per line, as in `{"instances": [...]}`), `*.csv` (one
  row per line; a first line that is not numeric is a header) and `*.parquet` (a column per model input, or
  one numeric column per value of a one-input model's row) object under the input prefix, in key order.
  Memory stays bounded: a few chunks of `chunk_rows` rows are held at a time (chunking.py, job.py); a line over
  `max_record_bytes` (1 MiB by default) is an error row whose bytes are never held, and a Parquet file is read
  one batch at a time, its footer, column count and row groups' decoded size checked first, its strings kept
  as dictionaries, and a chunk of its rows decodes to at most 32 MiB (parquet_reading.py).
- A file that cannot be read (not Parquet, truncated, corrupt, a column named twice, over a limit) is one error
  record, line 0, naming the file and why; rows read before it failed are scored, and the other files are read.
  The manifest's `inputs` give each file's outcome: `read`, or `failed` with the error.
- Output: part `i` holds the predictions for the rows of chunk `i` (`chunk_rows` rows, fewer where Parquet
  rows reach the chunk's decoded budget; chunks are cut the same way on every run): one JSON line per good row
  (`file`, `line`, then the response fields), or with `output_format="parquet"` the same as columns.
  A part is written whole (one PUT), so an existing part with this run's fingerprint is finished and a rerun
  skips it. Bad rows (that do not decode, or that the model refuses: refused.py) go to `errors/part-i.jsonl`
  (file, line, error) before their part, and are gathered into `errors.jsonl` at the end; `strict=True` stops
  at the first bad row instead. `manifest.json` is written last: row counts, model name/version/sha256, each
  input and part with its sha256. Nothing in the output depends on time, so an interrupted run plus a rerun is
  byte-identical to one uninterrupted run.
- Every input row ends in exactly one place: a line of its part, or a line of its error part. Each line must
  hold exactly one row (a JSON line `[..], [..]` holds two and is an error; a line ends only at `\\n`), so no
  line can shift another's prediction. Chunks of plain numbers decode in one vectorized pass, the rest line
  by line (decode.py); both read the same values and refuse the same lines. Before the manifest is written,
  every part and error part is read back and checked: its bytes against its sha256, and its (file, line)
  pairs against the chunk's rows, each exactly once. Error parts and `errors.jsonl` left by an earlier run
  that this run did not write are deleted.
- `engine: transform` (SageMaker Batch Transform) runs the same decoding in the realtime container, a
  mini-batch of lines per request (transform.py), and a step after the job writes the manifest.
"""

from servestack.inference.tabular.job import OUTPUT_FORMATS, PART_FORMAT, BatchJob, sha256
from servestack.inference.tabular.rows import FORMATS, MAX_RECORD_BYTES, PARQUET, Progress
from servestack.inference.tabular.store import Store, StoredObject

__all__ = [
    "FORMATS",
    "MAX_RECORD_BYTES",
    "OUTPUT_FORMATS",
    "PARQUET",
    "PART_FORMAT",
    "BatchJob",
    "Progress",
    "Store",
    "StoredObject",
    "sha256",
]
