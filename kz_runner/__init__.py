"""kz_runner: runners, the timing library and the package contract.

Installable on a GPU host without the daemon's dependencies: nothing here imports
watchdog, dulwich, starlette or uvicorn.
"""

__version__ = "0.1.0"
