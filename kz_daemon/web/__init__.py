"""The web pages: templates, rendering, charts, commit and operator views."""
