"""The leaderboard's maths: operator rankings with their noise, speed of light, an accept's outcome."""
