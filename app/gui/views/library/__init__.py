"""The models on this machine: the Library page (with its first-run welcome), the Load dialog and
its option editors, and the Models in memory page.

Named for the library (not "models") so it is not confused with app/gui/models, the Qt table
models these views show."""
