"""draftsmith.train: heads' training objectives, the Accelerate loop, checkpoints, export and Hub push.

Empty until the EAGLE-3 training issue lands; `draftsmith train` is not offered before then.
"""
