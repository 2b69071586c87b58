"""Crons: run payloads fired on a schedule by the scheduler process."""
