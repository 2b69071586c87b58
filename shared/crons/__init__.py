"""Crons (issue 14): run payloads fired on a schedule by the scheduler process."""
