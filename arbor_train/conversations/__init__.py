"""Conversations and supervision: the shared schema (schema), the benchmark loaders (locomo, irc,
longmemeval, beam), the supervision row schema (supervision) and row io (io)."""
