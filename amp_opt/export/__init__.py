"""From a plan to what a training launcher takes: DeepSpeed (:mod:`.deepspeed`) and Megatron-LM
(:mod:`.megatron`), with the rank-to-device launch mapping both need (:mod:`.ranks`).
"""
