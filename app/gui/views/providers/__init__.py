"""The Providers page: the remote engines Hearth routes to, and its add/edit dialogs."""
