"""One Hearth window per data folder: a second launch asks the first to show itself and exits."""

from __future__ import annotations

import getpass
import hashlib
import logging

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from app.paths import AppPaths

log = logging.getLogger(__name__)

ACTIVATE = b"activate\n"


def instance_name(paths: AppPaths) -> str:
    """A local-socket name unique to this user and data folder, so HEARTH_HOME instances (and
    other users) never find each other."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        user = ""
    digest = hashlib.sha256(f"{user}\0{paths.data}".encode()).hexdigest()[:16]
    return f"hearth-{digest}"


class SingleInstance(QObject):
    """``activate_running()`` in a new process; ``listen()`` in the one that stays."""

    activation_requested = Signal()

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self._server: QLocalServer | None = None

    def activate_running(self, timeout_ms: int = 1000) -> bool:
        """Ask a running instance to show its window. Returns True when one answered."""
        sock = QLocalSocket()
        sock.connectToServer(self.name)
        if not sock.waitForConnected(timeout_ms):
            return False
        sock.write(ACTIVATE)
        sock.flush()
        sock.waitForBytesWritten(timeout_ms)
        sock.disconnectFromServer()
        if sock.state() != QLocalSocket.LocalSocketState.UnconnectedState:
            sock.waitForDisconnected(timeout_ms)
        log.info("another Hearth window is open; asked it to come forward")
        return True

    def listen(self) -> bool:
        """Become the instance others activate. A stale socket from a crash is replaced."""
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(self.name):
            # nobody answered activate_running, so the name is a leftover: take it over
            QLocalServer.removeServer(self.name)
            if not server.listen(self.name):
                log.warning(
                    "single-instance socket %s unavailable: %s", self.name, server.errorString()
                )
                return False
        server.newConnection.connect(self._on_server_new_connection)
        self._server = server
        return True

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server.deleteLater()
            self._server = None

    def _on_server_new_connection(self) -> None:
        if self._server is None:
            return
        while (sock := self._server.nextPendingConnection()) is not None:
            # bound-method slots, not lambdas: a lambda holding the socket makes a reference
            # cycle that outlives QApplication and crashes the interpreter at exit
            sock.readyRead.connect(self._on_socket_ready_read)
            sock.disconnected.connect(sock.deleteLater)
            if sock.bytesAvailable():
                self._read(sock)

    def _on_socket_ready_read(self) -> None:
        sock = self.sender()
        if isinstance(sock, QLocalSocket):
            self._read(sock)

    def _read(self, sock: QLocalSocket) -> None:
        data = bytes(sock.readAll().data())
        if ACTIVATE.strip() in data:
            self.activation_requested.emit()
