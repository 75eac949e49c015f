"""The HTTP API: public and runner routes, their spec and OpenAPI, authorisation, rate limits, metrics, error responses."""
