"""The local cluster's secured mode: Kafka's own SASL over TLS, and its authorizer, as production runs them.

- TLS: a local CA and one node certificate it signs (for 127.0.0.1 and localhost), made once by the JDK's
  keytool, kept under `<home>/kafka-security/` with the CA's certificate as PEM for librdkafka's
  `ssl.ca.location`. The keystores' password goes to keytool through its environment, never an argument.
- Clients log in with SASL/SCRAM-SHA-512 on the nodes' one client listener, which is also the brokers'
  own (inter-broker traffic is SASL_SSL too, as the operator's `admin`). The controller listener is TLS
  with client certificates: SCRAM credentials live in the metadata the controllers serve, so a
  controller cannot log in with them; the nodes' certificate is their principal there.
- KRaft's StandardAuthorizer: no ACL, no access, except for the super users (`admin` and the nodes).

`admin` is created when a node's storage is formatted (`scram_arguments`); other users, a pipeline's own
principal among them, are made through the admin API by whoever holds `admin` (`add_user`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

MODES = ("none", "sasl_ssl")  # what `kafka-batch local up --kafka-security` takes
ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
NODE_DN = "CN=kafka-batch-node"  # the nodes' principal on the controller listener (its certificate's subject)
_VALIDITY_DAYS = "3650"


@dataclass(frozen=True)
class Secured:
    """The files and secrets of a secured local cluster, under `directory` (readable by its owner only)."""

    directory: Path
    admin_password: str
    store_password: str

    @property
    def ca_pem(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.directory / "node.p12"

    @property
    def truststore(self) -> Path:
        return self.directory / "truststore.p12"


def ensure(directory: Path, java_home: str | None) -> Secured:
    """The CA, the node certificate, the stores and the admin's password, made on the first call."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    secrets_file = directory / "secrets.json"
    if not secrets_file.exists():
        made = {"admin_password": secrets.token_urlsafe(18), "store_password": secrets.token_urlsafe(18)}
        secrets_file.touch(mode=0o600)
        secrets_file.write_text(json.dumps(made))
    known = json.loads(secrets_file.read_text())
    secured = Secured(directory, known["admin_password"], known["store_password"])
    if not (secured.ca_pem.exists() and secured.keystore.exists() and secured.truststore.exists()):
        _make_certificates(secured, java_home)
    return secured


def _make_certificates(secured: Secured, java_home: str | None) -> None:
    """keytool's steps of Kafka's own TLS guide: a CA, a node key pair, its certificate signed by the CA for
    127.0.0.1 (clients check the name), the chain in the node's keystore, the CA alone in the truststore."""
    d = secured.directory
    for name in ("ca.p12", "node.p12", "truststore.p12", "node.csr", "node.pem", "ca.pem"):
        (d / name).unlink(missing_ok=True)
    store = ("-storetype", "PKCS12", "-storepass:env", "KAFKA_BATCH_STORE_PASSWORD")
    ca, node = ("-keystore", str(d / "ca.p12"), *store), ("-keystore", str(secured.keystore), *store)
    key = ("-keyalg", "RSA", "-keysize", "2048", "-validity", _VALIDITY_DAYS)
    steps = [
        ("-genkeypair", "-alias", "ca", "-dname", "CN=kafka-batch local CA", *key, "-ext", "bc:c", *ca),
        ("-exportcert", "-alias", "ca", "-rfc", "-file", str(secured.ca_pem), *ca),
        ("-genkeypair", "-alias", "node", "-dname", NODE_DN, *key, *node),
        ("-certreq", "-alias", "node", "-file", str(d / "node.csr"), *node),
        ("-gencert", "-alias", "ca", "-infile", str(d / "node.csr"), "-outfile", str(d / "node.pem"), "-rfc",
         "-validity", _VALIDITY_DAYS, "-ext", "SAN=ip:127.0.0.1,dns:localhost",
         "-ext", "KU=digitalSignature,keyEncipherment", "-ext", "EKU=serverAuth,clientAuth", *ca),
        ("-importcert", "-alias", "ca", "-file", str(secured.ca_pem), "-noprompt", *node),
        ("-importcert", "-alias", "node", "-file", str(d / "node.pem"), *node),
        ("-importcert", "-alias", "ca", "-file", str(secured.ca_pem), "-noprompt",
         "-keystore", str(secured.truststore), *store),
    ]
    keytool = str(Path(java_home) / "bin" / "keytool") if java_home else (shutil.which("keytool") or "keytool")
    env = {**os.environ, "KAFKA_BATCH_STORE_PASSWORD": secured.store_password}
    for step in steps:
        result = subprocess.run([keytool, *step], env=env, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"keytool {step[0]} failed (exit {result.returncode}): {result.stdout}{result.stderr}")
    for name in ("node.csr", "node.pem"):
        (d / name).unlink()


def broker_settings(secured: Secured) -> dict[str, str]:
    """server.properties settings of a secured node, over write_config's (see the module's docstring)."""
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}"'
            f' password="{secured.admin_password}";')
    return {
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
        "listener.name.controller.ssl.client.auth": "required",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(secured.keystore),
        "ssl.keystore.password": secured.store_password,
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(secured.truststore),
        "ssl.truststore.password": secured.store_password,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN};User:{NODE_DN}",
        "allow.everyone.if.no.acl.found": "false",
    }


def scram_arguments(secured: Secured) -> list[str]:
    """The storage tool's arguments that create `admin` in the metadata log (the brokers log in as it)."""
    return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={secured.admin_password}]"]


def client_config(secured: Secured, bootstrap: str, user: str = ADMIN, password: str | None = None) -> dict[str, str]:
    """librdkafka settings of a client logging in as `user` (the admin by default)."""
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM,
            "sasl.username": user, "sasl.password": secured.admin_password if password is None else password,
            "ssl.ca.location": str(secured.ca_pem)}


def connection(config: dict[str, str]) -> str:
    """A client's settings as an Airflow Kafka connection stores them (the provider's form): the SASL user
    and password as login and password, the rest in the extra."""
    extra = dict(config)
    login = {"login": extra.pop("sasl.username"), "password": extra.pop("sasl.password")} if "sasl.username" in extra else {}
    return json.dumps({"conn_type": "kafka", **login, "extra": extra})


def add_user(admin_config: dict[str, str], user: str, password: str, timeout: float = 30.0) -> None:
    """Create (or give a new password to) a SCRAM user, as the operator's `kafka-configs.sh --alter
    --add-config 'SCRAM-SHA-512=[...]'` does."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient(admin_config)
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          password.encode())
    for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
        future.result(timeout=timeout + 15)
