"""MLServer's side of the peers bench (bench/peers.py): a custom runtime that runs the same ONNX file as ours
with onnxruntime (one intra-op thread, as ours), so that the comparison is of the servers, not of the models'
runtimes. A tensor request is decoded by MLServer's numpy codec; a request whose `content_type` is "pd" by its
pandas codec, into a DataFrame whose columns become the model's `[N, 1]` inputs. It answers the model's first
output (the label), as ours answers the prediction.

Imported by MLServer in its own environment (`make bench-peers` builds .bench/peers from
bench/peers-requirements.txt), never by servestack's, which has no MLServer: nothing here is type-checked or
imported by the suite; tests/functional/test_bench_smoke.py runs it where MLServer is importable.
"""

from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec, PandasCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri

from bench.peer_requests import PANDAS_CONTENT_TYPE, column_feeds


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        path = await get_model_uri(self.settings)
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.columns = [(i.name, i.type) for i in self.session.get_inputs()]
        self.label = self.session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        if payload.parameters is not None and payload.parameters.content_type == PANDAS_CONTENT_TYPE:
            frame = PandasCodec.decode_request(payload)
            feeds = column_feeds(self.columns, {name: frame[name].to_numpy() for name in frame.columns})
        else:
            feeds = {tensor.name: NumpyCodec.decode_input(tensor) for tensor in payload.inputs}
        (labels,) = self.session.run([self.label], feeds)
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self.label, labels)])
