"""The MLX runtime, in process through mlx-lm (runtime.py), with vision models through mlx-vlm
(vision.py)."""
