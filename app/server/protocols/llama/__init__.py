"""llama-server's own wire (its ``/infill``): what llama.vscode, llama.vim and Twinny speak."""
