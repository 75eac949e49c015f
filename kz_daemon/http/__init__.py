"""The HTTP shim (Starlette under uvicorn) and the web leaderboard."""
