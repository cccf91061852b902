"""The desktop walkthrough: the real window, a real service and real models driven through what a
new user does, each step checked and photographed. Run it under a real X server:

    xvfb-run -a -s "-screen 0 1920x1200x24" python -m tests.gui.walkthrough OUT_DIR \\
        [--theme light|dark|both] [--assets assets]

``--assets`` also writes the README's screenshots there. tests/gui/test_walkthrough.py runs its
cheap steps offscreen so it keeps working."""
