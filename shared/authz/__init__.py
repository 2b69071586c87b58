"""Authorization by the project's own `langgraph_sdk.Auth` (`auth.path` in langgraph.json).

One room for every decision: `loader` finds the project's Auth object, `users` turns what
`@auth.authenticate` returns into a user, `filters` gives a handler's filter its meaning
(JSONB containment on metadata, in SQL and in Python), and `decide` runs the handlers
(most specific first, fail closed). Web routes, WebSocket frames, cron firings and the
store a graph gets at run time all ask `Authorizer`.
"""
