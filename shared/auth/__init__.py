"""Authentication (A4): hashed API keys in Postgres, env keys, and bearer JWTs."""
