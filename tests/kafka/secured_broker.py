"""A local broker with SASL/PLAIN logins and ACLs enforced, for the security tests.

The project's `LocalBroker`, given the properties that turn on authentication and
authorization: a SASL_PLAINTEXT listener where the users `admin`, `app` and `daemon`
log in, and KRaft's `StandardAuthorizer`, which denies whatever no ACL allows
(`allow.everyone.if.no.acl.found=false`, its default, set here to say so).

Two listeners stay PLAINTEXT, and their principal (User:ANONYMOUS) is a super user:
the controller listener, which the broker uses to forward admin requests to the
controller (Kafka authorizes the forwarding broker's principal there, then the
client's), and the broker's own listener, which carries inter-broker traffic and the
readiness probe `LocalBroker` makes without logging in. Tests reach the broker only
through `sasl_bootstrap`, where every client is one of the three users.
"""

from __future__ import annotations

from typing import Any, Final

from delayservice.ports import free_port
from delayservice.testing.local_broker import LocalBroker

PASSWORDS: Final = {"admin": "admin-secret", "app": "app-secret", "daemon": "daemon-secret"}
"""The PLAIN users and their passwords (test only)."""
SASL_LISTENER: Final = "SASL"


def _jaas() -> str:
    users = " ".join(f'user_{name}="{password}"' for name, password in PASSWORDS.items())
    return (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="admin" password="{PASSWORDS["admin"]}" {users};'
    )


class SecuredBroker(LocalBroker):
    """`LocalBroker` with a SASL_PLAINTEXT listener at `sasl_bootstrap` and ACLs on."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sasl_port = free_port()
        self.sasl_bootstrap = f"127.0.0.1:{self.sasl_port}"
        listener = SASL_LISTENER.lower()
        self.extra = {
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},"
                f"{SASL_LISTENER}://127.0.0.1:{self.sasl_port},"
                f"CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},{SASL_LISTENER}://127.0.0.1:{self.sasl_port}"
            ),
            "listener.security.protocol.map": (
                f"PLAINTEXT:PLAINTEXT,{SASL_LISTENER}:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "inter.broker.listener.name": "PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            f"listener.name.{listener}.sasl.enabled.mechanisms": "PLAIN",
            f"listener.name.{listener}.plain.sasl.jaas.config": _jaas(),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": "User:admin;User:ANONYMOUS",
            **self.extra,
        }

    def login(self, user: str) -> dict[str, str]:
        """librdkafka keys for `user` on the SASL listener (bootstrap included)."""
        return {
            "bootstrap.servers": self.sasl_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": PASSWORDS[user],
        }
