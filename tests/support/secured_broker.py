"""mosquitto with TLS, client certificates and passwords, configured as a test needs it.

The TLS listener is on ``port``; ``plain_port`` (if asked for) is a loopback listener without
TLS or passwords, for what runs beside the client under test (the state store service, an
observer). Each listener has its own settings (``per_listener_settings``).
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
from pathlib import Path

from tests.support.mosquitto import Mosquitto
from tests.support.pki import Pki
from tests.support.ports import free_port

_TLS_LISTENER = """\
listener {port} 127.0.0.1
cafile {ca}
certfile {cert}
keyfile {key}
require_certificate {require}
use_identity_as_username false
allow_anonymous {anonymous}
"""
_PLAIN_LISTENER = """\
listener {port} 127.0.0.1
allow_anonymous true
"""
_COMMON = """\
per_listener_settings true
persistence false
set_tcp_nodelay true
log_dest stderr
log_dest topic
log_type error
log_type warning
log_type notice
log_type information
connection_messages true
"""


def password_file(path: Path, users: dict[str, str]) -> Path:
    """A mosquitto password file for ``users`` (name -> password)."""
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        raise RuntimeError("mosquitto_passwd is not installed (Debian package mosquitto)")
    path.unlink(missing_ok=True)
    for index, (name, password) in enumerate(users.items()):
        create = ["-c"] if index == 0 else []
        subprocess.run([tool, *create, "-b", str(path), name, password], check=True, timeout=10)
    return path


class SecuredMosquitto(Mosquitto):
    def __init__(
        self,
        pki: Pki,
        *,
        server_cert: Path | None = None,
        require_certificate: bool = False,
        users: dict[str, str] | None = None,
        plain_listener: bool = False,
        port: int | None = None,
    ) -> None:
        super().__init__(port)
        self.plain_port = free_port() if plain_listener else None
        # Started as root, mosquitto switches to user "mosquitto", which cannot read the
        # certificates and password files in the tests' private directories.
        config = f"user {getpass.getuser()}\n" + _COMMON
        config += _TLS_LISTENER.format(
            port=self.port,
            ca=pki.ca,
            cert=server_cert or pki.server_cert,
            key=pki.server_key,
            require="true" if require_certificate else "false",
            anonymous="false" if users else "true",
        )
        if users:
            config += f"password_file {password_file(self._dir / 'passwords', users)}\n"
        if self.plain_port is not None:
            config += _PLAIN_LISTENER.format(port=self.plain_port)
        self._conf.write_text(config)

    def listeners(self) -> list[int]:
        return [self.port] if self.plain_port is None else [self.port, self.plain_port]

    @property
    def plain_url(self) -> str:
        assert self.plain_port is not None, "started without a plain listener"
        return f"mqtt://{self.host}:{self.plain_port}"
