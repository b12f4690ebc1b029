"""This project's entry points: what its functions and containers run.

Each module re-exports servestack's adapter for one AWS runtime. Wrap one here to add what your project needs
(authentication, extra routes, logging); the constructs name these modules in the templates they synthesize.
"""
