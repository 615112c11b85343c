"""Test doubles at the outer edges only.

`actors.FakeActor` is a real actor process (real sockets, real signals) whose *behaviour*
misbehaves on cue, for supervisor tests: fail at start, start slowly, ignore SIGTERM, drop
messages, end the run after a while. Everything it talks to stays real.
"""
