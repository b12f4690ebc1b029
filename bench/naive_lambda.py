"""The day-one Lambda handler: the naive FastAPI app of bench/naive_server.py wrapped by Mangum."""

from mangum import Mangum

from bench.naive_server import app

handler = Mangum(app, lifespan="off")
