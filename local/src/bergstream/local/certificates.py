"""TLS for the local broker: a certificate authority and the broker's key store, made once with the JDK's
keytool when a secured stack is first started.

Clients trust the authority's certificate (a PEM file, which the Java client and librdkafka both read). The
authority's private key lives only while it signs the broker's certificate: nothing else is ever signed.
The broker's certificate names every loopback address, so all brokers of a local stack can share it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from bergstream.errors import StackError, require_tool

CA_FILE = "ca.pem"
KEYSTORE_FILE = "broker.p12"
BROKER_NAME = "CN=bergstream-broker"
# Hostname verification: clients connect to the address the broker advertises.
SUBJECT_ALTERNATIVE_NAMES = "dns:localhost,ip:127.0.0.1,ip:::1"
KEY = ["-keyalg", "EC", "-groupname", "secp256r1"]
_CA_ALIAS, _BROKER_ALIAS = "ca", "broker"


def keytool() -> str:
    """The keytool of the JDK that runs the broker."""
    java_home = os.environ.get("JAVA_HOME")
    candidates = [Path(java_home) / "bin" / "keytool"] if java_home else []
    java = shutil.which("java")
    if java is not None:
        candidates.append(Path(java).resolve().parent / "keytool")
    found = next((str(path) for path in candidates if path.exists()), None)
    return found or require_tool("keytool", "make the broker's TLS certificate (it comes with the JDK)")


def _start(arguments: list[str], env: dict[str, str], output: Path | None = None) -> subprocess.Popen[bytes]:
    # Passwords travel in the environment (-storepass:env), never on a command line others can read.
    stdout = output.open("wb") if output is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [keytool(), *arguments], env=env, stdout=stdout, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
    finally:
        if output is not None:
            stdout.close()  # type: ignore[union-attr]


def _wait(*started: subprocess.Popen[bytes]) -> None:
    for process in started:
        _, error = process.communicate()
        if process.returncode != 0:
            lines = [line for line in error.decode(errors="replace").splitlines() if line.strip()]
            raise StackError(f"keytool failed making the broker's certificate: {(lines or ['?'])[-1]}")


def make_authority(directory: Path, name: str = "bergstream local CA") -> tuple[Path, str]:
    """A new certificate authority in `directory`: its key store (ca.p12) and that store's password."""
    directory.mkdir(parents=True, exist_ok=True)
    store, password = directory / "ca.p12", secrets.token_urlsafe(24)
    env = {**os.environ, "CA_PASSWORD": password}
    _wait(
        _start(
            ["-genkeypair", "-alias", _CA_ALIAS, *KEY, "-dname", f"CN={name}", "-ext", "bc:c",
             "-validity", "3650", "-keystore", str(store), "-storetype", "PKCS12", "-storepass:env",
             "CA_PASSWORD"],
            env,
        )
    )  # fmt: skip
    return store, password


def export_authority(store: Path, password: str, pem: Path) -> None:
    """The authority's certificate, as the PEM file that clients trust."""
    env = {**os.environ, "CA_PASSWORD": password}
    _wait(
        _start(
            ["-exportcert", "-alias", _CA_ALIAS, "-rfc", "-keystore", str(store), "-storepass:env",
             "CA_PASSWORD"],
            env, pem,
        )
    )  # fmt: skip


def make_certificates(directory: Path, keystore_password: str) -> None:
    """ca.pem and broker.p12 (the broker's key and its certificate chain, signed by the authority)."""
    directory.mkdir(parents=True, exist_ok=True)
    keystore = directory / KEYSTORE_FILE
    with tempfile.TemporaryDirectory(prefix="ca-", dir=directory) as scratch:
        work = Path(scratch)
        env = {**os.environ, "STORE_PASSWORD": keystore_password}
        broker_key = _start(
            ["-genkeypair", "-alias", _BROKER_ALIAS, *KEY, "-dname", BROKER_NAME, "-validity", "825",
             "-keystore", str(keystore), "-storetype", "PKCS12", "-storepass:env", "STORE_PASSWORD"],
            env,
        )  # fmt: skip
        ca_store, ca_password = make_authority(work)
        env["CA_PASSWORD"] = ca_password
        _wait(broker_key)
        ca_pem, request, chain = work / CA_FILE, work / "broker.csr", work / "chain.pem"
        _wait(
            _start(["-exportcert", "-alias", _CA_ALIAS, "-rfc", "-keystore", str(ca_store),
                    "-storepass:env", "CA_PASSWORD"], env, ca_pem),
            _start(["-certreq", "-alias", _BROKER_ALIAS, "-keystore", str(keystore),
                    "-storepass:env", "STORE_PASSWORD"], env, request),
        )  # fmt: skip
        _wait(
            _start(
                ["-gencert", "-alias", _CA_ALIAS, "-keystore", str(ca_store), "-storepass:env", "CA_PASSWORD",
                 "-infile", str(request), "-rfc", "-validity", "825",
                 "-ext", f"SAN={SUBJECT_ALTERNATIVE_NAMES}", "-ext", "KU=digitalSignature",
                 "-ext", "EKU=serverAuth,clientAuth"],
                env, chain,
            )
        )  # fmt: skip
        chain.write_text(chain.read_text() + ca_pem.read_text())
        _wait(
            _start(["-importcert", "-alias", _BROKER_ALIAS, "-file", str(chain), "-noprompt",
                    "-keystore", str(keystore), "-storepass:env", "STORE_PASSWORD"], env)
        )  # fmt: skip
        keystore.chmod(0o600)
        # Last: a folder with ca.pem is complete.
        shutil.copyfile(ca_pem, directory / CA_FILE)
