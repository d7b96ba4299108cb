"""The cache modes' engine side, one module each (the registry is decode/forward_modes.py): what a
cache mode decides for a request at each step (its forward, what it may commit) and what it remembers
across steps (its own state object, ``CacheMode.new_state``)."""
