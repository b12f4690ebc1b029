"""One thin adapter per AWS runtime around the inference core (models/).

numpy's BLAS gets one thread unless the environment asks for more. This runs before any handler imports numpy:
OpenBLAS starts a thread per core on import (a batch job pinned to one core spent ~0.06 CPU s on it, a
96-core host far more), and nothing here multiplies matrices with numpy: onnxruntime has its own threads
(`intra_op_threads`), and serving runs one worker per core.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
