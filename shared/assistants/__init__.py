"""Assistants: versioned configurations of the config's graphs, in Postgres."""
