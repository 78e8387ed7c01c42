"""draftsmith.data_recipes: conversations, chat templating, loss masks, regeneration, hidden-state capture,
draft-vocabulary maps.

Empty until the data recipes issue lands; `draftsmith data` is not offered before then.
"""
