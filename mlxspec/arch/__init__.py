"""What mlxspec knows of mlx-lm's model classes, in one place: which can take a token
tree and the RoPE wrapper tree calls use (families), and how to change a model's
modules without re-implementing its forward (surgery).  Imports only util and errors.
"""
