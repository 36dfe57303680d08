"""The imperative shell: the Faust app, topics, tables, agents, timer, web views and CLI."""
