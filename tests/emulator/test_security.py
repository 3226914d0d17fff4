"""TLS, client certificates, users, K8S-SAT tokens and authorization rules, end to end.

The emulator runs in this process on its own loop thread; clients are paho (a library that
is not ours) and raw sockets speaking our codec, with certificates the tests make.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest

from agent.emulator import mqtt_packets as mp
from agent.emulator.authn import Authenticator, TokenFile, parse_users
from agent.emulator.authz import ClientIdentity, parse_rules
from agent.emulator.tls import server_context
from agent.protocol import topics
from agent.protocol.resp3 import encode_request
from tests.emulator.certs import Authority, Issued
from tests.emulator.conftest import TIMEOUT, EmulatorThread, RawClient
from tests.support.paho_client import PahoStoreClient, now_ts

EmulatorFactory = Callable[..., EmulatorThread]
OK = b"+OK\r\n"
NOT_AUTHORIZED = b"-ERR not authorized\r\n"


class Pki:
    def __init__(self, directory: Path) -> None:
        self.ca = Authority(directory, "test-ca")
        self.server = self.ca.issue("localhost", server=True)
        self.gateway = self.ca.issue("gw1")
        self.viewer = self.ca.issue("viewer")
        self.expired = self.ca.issue("old", expired=True)
        self.rogue_ca = Authority(directory, "rogue-ca")
        self.rogue = self.rogue_ca.issue("gw1")

    def server_context(self, *, mutual: bool = False) -> ssl.SSLContext:
        return server_context(
            self.server.cert, self.server.key, self.ca.cert_file if mutual else None
        )

    def client_context(
        self, client: Issued | None = None, *, ca: Path | None = None
    ) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca or self.ca.cert_file))
        if client is not None:
            context.load_cert_chain(client.cert, client.key)
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def store_clients() -> Iterator[Callable[..., PahoStoreClient]]:
    made: list[PahoStoreClient] = []

    def make(port: int, client_id: str, **options: Any) -> PahoStoreClient:
        client = PahoStoreClient("127.0.0.1", port, client_id, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def tls(context: ssl.SSLContext) -> Callable[[paho.Client], object]:
    return lambda client: client.tls_set_context(context)


def raw_tls(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> RawClient:
    raw = RawClient(port)
    raw.sock = context.wrap_socket(raw.sock, server_hostname=host)
    return raw


def refused(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> str:
    """Why a TLS connection that must fail failed (the handshake, or right after it)."""
    try:
        raw = raw_tls(port, context, host)
    except ssl.SSLError as error:
        return f"handshake: {error.reason}"
    try:
        raw.send(mp.Connect("x"))
        packet = raw.receive()
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as error:
        return f"after the handshake: {getattr(error, 'reason', error)}"
    finally:
        raw.close()
    assert packet is None, f"expected a refusal, got {packet!r}"
    return "closed"


# ---------------------------------------------------------------------------- TLS


def test_tls_serves_the_store_and_refuses_what_it_must(
    pki: Pki, emulator_factory: EmulatorFactory, store_clients: Callable[..., PahoStoreClient]
) -> None:
    server = emulator_factory(ssl_context=pki.server_context())
    assert server.emulator.url.startswith("mqtts://")
    client = store_clients(server.port, "tls-client", configure=tls(pki.client_context()))
    assert client.request("SET", "k", "v").payload == OK
    assert client.request("GET", "k").payload == b"$1\r\nv\r\n"

    # A client that does not trust the server's CA, or expects another name, refuses it.
    other_ca = pki.client_context(ca=pki.rogue_ca.cert_file)
    assert "CERTIFICATE_VERIFY_FAILED" in refused(server.port, other_ca)
    assert "CERTIFICATE_VERIFY_FAILED" in refused(
        server.port, pki.client_context(), "wrong.example"
    )
    # Plain MQTT to the TLS port is not MQTT to it.
    plain = RawClient(server.port)
    plain.send(mp.Connect("plain"))
    plain.expect_closed(TIMEOUT * 3)
    plain.close()
    assert server.call(server.emulator.broker.connected_clients) == {"tls-client"}


def test_mutual_tls_knows_the_certificate_subject_and_refuses_the_rest(
    pki: Pki, emulator_factory: EmulatorFactory, store_clients: Callable[..., PahoStoreClient]
) -> None:
    server = emulator_factory(ssl_context=pki.server_context(mutual=True))
    client = store_clients(server.port, "gw1", configure=tls(pki.client_context(pki.gateway)))
    assert client.request("SET", "k", "v").payload == OK
    identity = server.call(server.emulator.broker.identity, "gw1")
    assert identity == ClientIdentity("gw1", None, pki.gateway.subject)
    assert pki.gateway.subject == "CN=gw1,O=plant"

    assert refused(server.port, pki.client_context())  # no client certificate
    assert refused(server.port, pki.client_context(pki.rogue))  # signed by another CA
    assert refused(server.port, pki.client_context(pki.expired))
    assert server.call(server.emulator.broker.connected_clients) == {"gw1"}


def test_rules_by_certificate_subject(
    pki: Pki, emulator_factory: EmulatorFactory, store_clients: Callable[..., PahoStoreClient]
) -> None:
    rules = parse_rules(
        json.dumps(
            {
                "rules": [
                    {
                        "principals": {"certificateSubjects": ["CN=gw1,O=plant"]},
                        "brokerResources": [
                            {"method": "Connect"},
                            {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#"]},
                        ],
                        "stateStoreResources": [
                            {"keyType": "Pattern", "keys": ["*"], "method": "ReadWrite"}
                        ],
                    },
                    {
                        "principals": {"certificateSubjects": ["CN=viewer,*"]},
                        "brokerResources": [
                            {"method": "Connect"},
                            {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#"]},
                        ],
                        "stateStoreResources": [
                            {"keyType": "Pattern", "keys": ["*"], "method": "Read"}
                        ],
                    },
                ]
            }
        )
    )
    server = emulator_factory(ssl_context=pki.server_context(mutual=True), rules=rules)
    writer = store_clients(server.port, "w", configure=tls(pki.client_context(pki.gateway)))
    viewer = store_clients(server.port, "v", configure=tls(pki.client_context(pki.viewer)))
    assert writer.request("SET", "k", "v").payload == OK
    assert viewer.request("GET", "k").payload == b"$1\r\nv\r\n"
    assert viewer.request("SET", "k", "w").payload == NOT_AUTHORIZED
    assert viewer.request("DEL", "k").payload == NOT_AUTHORIZED
    assert writer.request("GET", "k").payload == b"$1\r\nv\r\n"


# ---------------------------------------------------------------------------- users and rules

RULES = {
    "rules": [
        {
            "principals": {"usernames": ["operator"]},
            "brokerResources": [
                {"method": "Connect"},
                {"method": "Publish", "topics": ["plant/{principal.username}/#"]},
                {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#", "plant/#"]},
            ],
            "stateStoreResources": [
                {"keyType": "Pattern", "keys": ["line1/*"], "method": "ReadWrite"},
                {"keyType": "String", "keys": ["site"], "method": "Read"},
            ],
        },
        {
            "principals": {"usernames": ["guest"]},
            "stateStoreResources": [{"keyType": "Pattern", "keys": ["*"], "method": "Read"}],
        },
    ]
}


def credentials(username: str, password: str) -> Callable[[paho.Client], object]:
    return lambda client: client.username_pw_set(username, password)


@pytest.fixture
def guarded(emulator_factory: EmulatorFactory) -> EmulatorThread:
    users = parse_users(json.dumps({"operator": "op-pass", "guest": "guest-pass"}))
    return emulator_factory(
        rules=parse_rules(json.dumps(RULES)), authenticator=Authenticator(users=users)
    )


def test_users_are_checked(guarded: EmulatorThread) -> None:
    for username, password, code in [
        ("operator", b"op-pass", mp.ReasonCode.SUCCESS),
        ("operator", b"wrong", mp.ReasonCode.BAD_USER_NAME_OR_PASSWORD),
        ("nobody", b"op-pass", mp.ReasonCode.BAD_USER_NAME_OR_PASSWORD),
        (None, None, mp.ReasonCode.NOT_AUTHORIZED),
        # A known user with no Connect grant.
        ("guest", b"guest-pass", mp.ReasonCode.NOT_AUTHORIZED),
    ]:
        raw = RawClient(guarded.port)
        raw.send(mp.Connect("u", username=username, password=password))
        assert raw.expect(mp.Connack).reason_code == code, username
        raw.close()


def test_store_requests_outside_the_grant_are_not_authorized(
    guarded: EmulatorThread, store_clients: Callable[..., PahoStoreClient]
) -> None:
    operator = store_clients(guarded.port, "op", configure=credentials("operator", "op-pass"))
    assert operator.request("SET", "line1/dev\\setPoint", "21.5").payload == OK
    assert operator.request("KEYNOTIFY", "line1/dev\\setPoint").payload == OK
    assert operator.request("SET", "line2/dev\\setPoint", "1").payload == NOT_AUTHORIZED
    assert operator.request("GET", "line2/dev\\setPoint").payload == NOT_AUTHORIZED
    assert operator.request("KEYNOTIFY", "line2/x").payload == NOT_AUTHORIZED
    assert operator.request("GET", "site").payload == b"$-1\r\n"
    assert operator.request("SET", "site", "x").payload == NOT_AUTHORIZED
    assert operator.request("DEL", "site").payload == NOT_AUTHORIZED


def test_subscribe_and_publish_outside_the_grant_are_refused_at_the_mqtt_level(
    guarded: EmulatorThread,
) -> None:
    raw = RawClient(guarded.port)
    raw.connect("op", username="operator", password=b"op-pass")
    raw.send(
        mp.Subscribe(
            1,
            [
                mp.Subscription("plant/#", 1),
                mp.Subscription("#", 1),
                mp.Subscription("clients/op/#", 1),
                mp.Subscription("clients/other/#", 1),
                mp.Subscription(topics.notify_filter("op"), 1),
                mp.Subscription(topics.notify_filter("other"), 1),
            ],
        )
    )
    assert raw.expect(mp.Suback).reason_codes == [1, 0x87, 1, 0x87, 1, 0x87]
    raw.send(mp.Publish("plant/operator/x", b"ok", 1, packet_id=2))
    routed = raw.expect(mp.Publish)  # to itself: it subscribed plant/#
    assert routed.payload == b"ok"
    puback = raw.expect(mp.Puback)
    assert (puback.packet_id, puback.reason_code) == (2, 0)
    raw.send(mp.Publish("plant/other/x", b"no", 1, packet_id=3))
    puback = raw.expect(mp.Puback)
    assert (puback.packet_id, puback.reason_code) == (3, 0x87)
    raw.send(mp.Publish("plant/other/x", b"no", 0))  # QoS 0: dropped, nothing to say
    raw.send(mp.Pingreq())
    assert isinstance(raw.expect(mp.Pingresp), mp.Pingresp)  # and nothing was routed
    raw.close()


def test_a_will_outside_the_grant_is_refused(guarded: EmulatorThread) -> None:
    raw = RawClient(guarded.port)
    raw.send(mp.Connect("op", username="operator", password=b"op-pass", will=mp.Will("elsewhere")))
    assert raw.expect(mp.Connack).reason_code == mp.ReasonCode.NOT_AUTHORIZED
    raw.close()


# ---------------------------------------------------------------------------- K8S-SAT


def sat_connect(port: int, token: bytes | None, method: str = "K8S-SAT") -> mp.Connack:
    raw = RawClient(port)
    try:
        props = mp.Properties(authentication_method=method, authentication_data=token)
        raw.send(mp.Connect("pod", properties=props))
        return raw.expect(mp.Connack)
    finally:
        raw.close()


def test_k8s_sat_tokens(tmp_path: Path, emulator_factory: EmulatorFactory) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("eyJhbGciOiJSUzI1NiJ9.first.sig\n")
    server = emulator_factory(authenticator=Authenticator(tokens=TokenFile(tokens)))
    good = sat_connect(server.port, b"eyJhbGciOiJSUzI1NiJ9.first.sig")
    assert good.reason_code == 0
    assert good.properties.authentication_method == "K8S-SAT"
    assert sat_connect(server.port, b"forged").reason_code == mp.ReasonCode.NOT_AUTHORIZED
    assert sat_connect(server.port, None).reason_code == mp.ReasonCode.NOT_AUTHORIZED
    assert (
        sat_connect(server.port, b"x", "SCRAM-SHA-1").reason_code
        == mp.ReasonCode.BAD_AUTHENTICATION_METHOD
    )
    # A rotated token is accepted without a restart; the old one no longer.
    tokens.write_text("eyJhbGciOiJSUzI1NiJ9.second.sig\n")
    os.utime(tokens, ns=(1, 1))
    assert sat_connect(server.port, b"eyJhbGciOiJSUzI1NiJ9.second.sig").reason_code == 0
    assert sat_connect(server.port, b"eyJhbGciOiJSUzI1NiJ9.first.sig").reason_code == 0x87


def test_a_user_name_proven_by_nothing_buys_no_grants(
    tmp_path: Path, emulator_factory: EmulatorFactory, store_clients: Callable[..., PahoStoreClient]
) -> None:
    """Was: a valid K8S-SAT token with the user name `operator` (no password, or a wrong one)
    got operator's grants, its keys read and written."""
    tokens = tmp_path / "tokens"
    tokens.write_text("pod-token\n")
    users = parse_users(json.dumps({"operator": "op-pass"}))
    pods = {
        "principals": {"clientIds": ["pod"]},
        "brokerResources": [
            {"method": "Connect"},
            {"method": "Subscribe", "topics": ["clients/{principal.clientId}/#"]},
        ],
    }
    rules = parse_rules(json.dumps({"rules": [*RULES["rules"], pods]}))
    server = emulator_factory(
        rules=rules, authenticator=Authenticator(users=users, tokens=TokenFile(tokens))
    )
    operator = store_clients(server.port, "op", configure=credentials("operator", "op-pass"))
    assert operator.request("SET", "line1/dev\\setPoint", "21.5").payload == OK

    def sat(client: paho.Client, password: str | None) -> None:
        client.username_pw_set("operator", password)
        client.connect = _with_sat(client.connect)  # type: ignore[method-assign]

    for password in (None, "wrong"):
        pod = store_clients(server.port, "pod", configure=lambda c, p=password: sat(c, p))
        assert server.call(server.emulator.broker.identity, "pod") == ClientIdentity("pod")
        assert pod.request("GET", "line1/dev\\setPoint").payload == NOT_AUTHORIZED
        assert pod.request("SET", "line1/dev\\setPoint", "99").payload == NOT_AUTHORIZED
        pod.close()
    # Without a Connect grant of its own, the token alone does not get it in.
    raw = RawClient(server.port)
    props = mp.Properties(authentication_method="K8S-SAT", authentication_data=b"pod-token")
    raw.send(mp.Connect("someone", username="operator", properties=props))
    assert raw.expect(mp.Connack).reason_code == mp.ReasonCode.NOT_AUTHORIZED
    raw.close()
    # With the right password beside the token, the name is proven.
    raw = RawClient(server.port)
    raw.send(mp.Connect("op2", username="operator", password=b"op-pass", properties=props))
    assert raw.expect(mp.Connack).reason_code == 0
    assert server.call(server.emulator.broker.identity, "op2") == ClientIdentity("op2", "operator")
    raw.close()


def _with_sat(connect: Callable[..., Any]) -> Callable[..., Any]:
    """paho's connect(), with K8S-SAT enhanced authentication and the token as its data."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    def sat_connect(*args: Any, **kwargs: Any) -> Any:
        properties = Properties(PacketTypes.CONNECT)
        properties.AuthenticationMethod = "K8S-SAT"
        properties.AuthenticationData = b"pod-token"
        return connect(*args, properties=properties, **kwargs)

    return sat_connect


# ---------------------------------------------------------------------------- response topics


def store_request(
    packet_id: int, response_topic: str, *args: bytes, correlation: bytes = b"c" * 16
) -> mp.Publish:
    return mp.Publish(
        topics.INVOKE_TOPIC,
        encode_request(list(args)),
        1,
        packet_id=packet_id,
        properties=mp.Properties(
            response_topic=response_topic,
            correlation_data=correlation,
            user_properties=[(topics.TIMESTAMP, now_ts())],
        ),
    )


def test_the_store_answers_only_where_the_requester_may_publish(
    guarded: EmulatorThread, caplog: pytest.LogCaptureFixture
) -> None:
    """Was: naming `gateways/line1/health` as the response topic got the store to publish
    there for a client with no Publish grant on it."""
    caplog.set_level(logging.INFO, logger="agent.emulator")
    raw = RawClient(guarded.port)
    raw.connect("op", username="operator", password=b"op-pass")
    raw.send(mp.Subscribe(1, [mp.Subscription("plant/#", 1), mp.Subscription("clients/op/#", 1)]))
    raw.expect(mp.Suback)
    for packet_id, response_topic in enumerate(
        ["gateways/line1/health", "clients/someone-else/answers", "plant/other/answers"], 2
    ):
        raw.send(store_request(packet_id, response_topic, b"SET", b"line1/x", b"stolen"))
        puback = raw.expect(mp.Puback)
        assert (puback.packet_id, puback.reason_code) == (packet_id, 0x87), response_topic
        assert response_topic in caplog.text
    # Under a Publish grant, and in its own clients/{clientId}/ space, it is answered.
    for packet_id, response_topic in enumerate(
        ["plant/operator/answers", topics.response_topic("op")], 10
    ):
        raw.send(store_request(packet_id, response_topic, b"GET", b"line1/x"))
        received = [raw.receive(), raw.receive()]  # the answer and the PUBACK
        answer = next(p for p in received if isinstance(p, mp.Publish))
        assert answer.topic == response_topic and answer.payload == b"$-1\r\n"
        if answer.qos:
            raw.send(mp.Puback(answer.packet_id or 0))
    raw.close()


@pytest.mark.parametrize("response_topic", ["a/#", "", "x/+/y"])
def test_a_will_with_an_invalid_response_topic_is_refused_at_connect(
    emulator_factory: EmulatorFactory, response_topic: str
) -> None:
    """Was: accepted at CONNECT, and a traceback in the log when the will fired."""
    server = emulator_factory()
    raw = RawClient(server.port)
    will = mp.Will(
        topics.INVOKE_TOPIC,
        encode_request([b"GET", b"k"]),
        1,
        properties=mp.Properties(response_topic=response_topic, correlation_data=b"c"),
    )
    raw.send(mp.Connect("w", will=will))
    assert raw.expect(mp.Connack).reason_code == mp.ReasonCode.PROTOCOL_ERROR
    raw.close()


def test_a_will_is_held_to_the_rules_of_a_request(
    guarded: EmulatorThread, store_clients: Callable[..., PahoStoreClient]
) -> None:
    """A will to the invoke topic is a store request: its response topic must be one its
    client may publish to (was: any, another client's included), and it runs as its client."""

    def will(response_topic: str, key: bytes) -> mp.Will:
        return mp.Will(
            topics.INVOKE_TOPIC,
            encode_request([b"SET", key, b"fired"]),
            1,
            properties=mp.Properties(
                response_topic=response_topic,
                correlation_data=b"c" * 16,
                user_properties=[(topics.TIMESTAMP, now_ts())],
            ),
        )

    def connect(response_topic: str, key: bytes) -> RawClient:
        raw = RawClient(guarded.port)
        left = will(response_topic, key)
        raw.send(mp.Connect("op", username="operator", password=b"op-pass", will=left))
        return raw

    raw = connect(topics.response_topic("victim"), b"line1/a")
    assert raw.expect(mp.Connack).reason_code == mp.ReasonCode.NOT_AUTHORIZED
    raw.close()
    raw = connect(topics.response_topic("op"), b"line1/b")
    assert raw.expect(mp.Connack).reason_code == 0
    raw.close()  # dropped: the will fires, as operator
    reader = store_clients(guarded.port, "reader", configure=credentials("operator", "op-pass"))
    deadline = time.monotonic() + TIMEOUT
    while (value := reader.request("GET", "line1/b").payload) != b"$5\r\nfired\r\n":
        assert time.monotonic() < deadline, value
