"""Speech to text in process: Whisper models in CTranslate2's format served by faster-whisper
(runtime.py), their audio decoded within bounds by PyAV (audio.py)."""
