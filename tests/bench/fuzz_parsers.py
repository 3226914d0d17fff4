"""Figures: every parser of hostile input, fuzzed; only its own documented errors may come out.

    python -m tests.bench.fuzz_parsers [--inputs N] [--seed S] [--only NAME ...]

Parsers: the RESP3 codec (requests, responses, any value), the notification parser, the
hybrid logical clock parser, the MQTT 5 packet codec (the incremental reader, then the
encoder on whatever it decoded), the controller's line protocol (lines, requests, replies,
salvaging, the line splitter) and Modbus RTU frames as the driver receives them (pymodbus's
RTU framer with the client's decoder).

Inputs come from hypothesis with a fixed seed: random bytes, and valid messages of each
kind mutated (bits flipped, cut, spliced, bytes inserted or repeated, numbers made huge),
so that the fuzzing reaches past the first checks. Each hypothesis example carries a batch
of inputs. Any exception other than the parser's own is a failure: the run prints, per
parser, the inputs tried and the distinct failures (exception type and where it was raised),
and exits 1 if there is any. `tests/protocol/test_fuzz_parsers.py` runs the same fuzzers
briefly in the default suite.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from agent.controller import line_protocol as lp
from agent.emulator import mqtt_packets as mp
from agent.protocol import resp3
from agent.protocol.hlc import Hlc, HlcError
from agent.protocol.resp3 import Resp3Error

BATCH = 20  # inputs per hypothesis example
DEFAULT_INPUTS = 100_000
DEFAULT_SEED = 20_240_601


# ---------------------------------------------------------------------------- corpora


def _mqtt_corpus() -> list[bytes]:
    props = mp.Properties(
        response_topic="r/t",
        correlation_data=b"\x01" * 16,
        content_type="application/octet-stream",
        message_expiry_interval=10,
        user_properties=[("__ts", "001700000000000:00000:c"), ("__srcId", "c")],
    )
    packets: list[mp.Packet] = [
        mp.Connect("client", keep_alive=30, username="u", password=b"p"),
        mp.Connect(
            "c",
            will=mp.Will("w/t", b"bye", 1, True, mp.Properties(will_delay_interval=5)),
            properties=mp.Properties(
                authentication_method="K8S-SAT",
                authentication_data=b"token",
                receive_maximum=10,
                maximum_packet_size=4096,
            ),
        ),
        mp.Connack(0, False, mp.Properties(receive_maximum=100, maximum_qos=1)),
        mp.Publish(
            "statestore/v1/x/command/invoke",
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
            1,
            False,
            False,
            7,
            props,
        ),
        mp.Publish("a/b", b"payload", 0),
        mp.Puback(7),
        mp.Puback(7, 0x87, mp.Properties(reason_string="no")),
        mp.Pubrec(1),
        mp.Pubrel(1),
        mp.Pubcomp(1),
        mp.Subscribe(3, [mp.Subscription("a/+", 1, True, True, 1), mp.Subscription("#", 0)]),
        mp.Suback(3, [1, 0x87]),
        mp.Unsubscribe(4, ["a/+"]),
        mp.Unsuback(4, [0]),
        mp.Pingreq(),
        mp.Pingresp(),
        mp.Disconnect(0x8E, mp.Properties(reason_string="bye")),
        mp.Auth(0x18, mp.Properties(authentication_method="K8S-SAT", authentication_data=b"t")),
    ]
    encoded = [mp.encode(packet) for packet in packets]
    return [*encoded, b"".join(encoded[:4]), b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04test"]


_RESP3_CORPUS = [
    resp3.encode_request([b"SET", b"k", b"v", b"NX", b"PX", b"1000"]),
    resp3.encode_request([b"GET", b"k" * 40]),
    resp3.encode_request([b"KEYNOTIFY", b"SOMEKEY", b"STOP"]),
    b"+OK\r\n",
    b"-ERR syntax error\r\n",
    b":-1\r\n",
    b"$-1\r\n",
    b"$5\r\nvalue\r\n",
    b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$4\r\n21.5\r\n",
    b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n",
    b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n",
]
_HLC_CORPUS = [
    b"001696374425000:00000:CLIENT",
    b"1696374425000:7:CLIENT",
    b"999999999999999:99999:n",
    b"000000000000000:00000:",
]
_LINE_CORPUS = [
    lp.encode_line("SET SP 21.5"),
    lp.encode_line("GET SP"),
    lp.encode_line("STATE SP=21.5 T=20.1 OUT=40 MODE=heat"),
    lp.encode_line("LIMITS 5.0 30.0 0.5"),
    lp.encode_line("ID TH-100 1.2.3 SN0001"),
    lp.encode_line("OK SP 21.5"),
    lp.encode_line("ERR RANGE 5.0 30.0"),
    lp.encode_line("SP 21.5", with_checksum=False),
    b"\x00\xffnoise" + lp.encode_line("T 20.5"),
]


def _modbus_corpus() -> list[bytes]:
    framer = _rtu_framer()
    crc = framer.compute_CRC
    frames = []
    for body in (
        b"\x01\x03\x04\x00\xd7\x00\xc8",  # read holding registers: 2 registers
        b"\x01\x04\x02\x00\xc8",  # read input registers
        b"\x01\x06\x00\x10\x00\xd7",  # write single register echo
        b"\x01\x10\x00\x10\x00\x02",  # write multiple registers
        b"\x01\x83\x02",  # exception: illegal address
    ):
        frames.append(body + crc(body).to_bytes(2, "big"))
    return frames


# ---------------------------------------------------------------------------- mutation


def mutated(corpus: Sequence[bytes]) -> st.SearchStrategy[bytes]:
    """Random bytes, and corpus items mutated in ways that get past the first checks."""

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(corpus)))
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.integers(0, 7))
            position = draw(st.integers(0, len(data)))
            if kind == 0 and data:  # flip bits
                index = min(position, len(data) - 1)
                data[index] ^= draw(st.integers(1, 255))
            elif kind == 1:  # cut
                data = data[:position]
            elif kind == 2:  # insert bytes
                data[position:position] = draw(st.binary(min_size=1, max_size=8))
            elif kind == 3:  # splice another item
                other = draw(st.sampled_from(corpus))
                data[position:] = other[draw(st.integers(0, len(other))) :]
            elif kind == 4 and data:  # repeat a slice
                end = draw(st.integers(position, len(data)))
                data[position:position] = data[position:end] * draw(st.integers(1, 4))
            elif kind == 5:  # a huge or odd number where digits were
                number = draw(
                    st.sampled_from([b"0", b"-1", b"99999999999999999999", b"9" * 5000, b"1e3"])
                )
                data[position:position] = number
            elif kind == 6 and data:  # a byte from the edges of ranges
                index = min(position, len(data) - 1)
                data[index] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xFF, 0x0D, 0x0A, 0x3A]))
            else:  # drop a byte
                del data[position : position + 1]
        return bytes(data)

    return st.one_of(st.binary(max_size=300), mutate())


# ---------------------------------------------------------------------------- targets


def _resp3(data: bytes) -> None:
    for decode in (resp3.decode, resp3.decode_request, resp3.decode_response):
        with contextlib.suppress(Resp3Error):
            decode(data)


def _notification(data: bytes) -> None:
    with contextlib.suppress(Resp3Error):
        resp3.decode_notification(data)


def _hlc(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    try:
        parsed = Hlc.parse(text)
    except HlcError:
        return
    # What parses formats back to a text that parses to the same timestamp.
    if Hlc.parse(str(parsed)) != parsed:
        raise AssertionError(f"round trip changed {text!r}")


def _mqtt(data: bytes) -> None:
    for max_size in (mp.MAX_PACKET_SIZE, 64):
        reader = mp.PacketReader(max_size)
        # Fed in two pieces, as a socket may deliver it.
        cut = len(data) // 3
        decoded: list[mp.Packet] = []
        try:
            reader.feed(data[:cut])
            decoded += list(reader)
            reader.feed(data[cut:])
            decoded += list(reader)
        except mp.MalformedPacket:
            pass
        for packet in decoded:
            # Everything the decoder accepts, the encoder writes back and reads the same.
            again = mp.PacketReader()
            again.feed(mp.encode(packet))
            if list(again) != [packet]:
                raise AssertionError(f"round trip changed {packet!r}")


def _line_protocol(data: bytes) -> None:
    for require in (True, False):
        try:
            frame = lp.decode_line(data, require_checksum=require)
        except lp.FramingError:
            continue
        with contextlib.suppress(lp.RequestError):
            lp.parse_request(frame.payload)
        with contextlib.suppress(lp.ProtocolError):
            lp.parse_reply(frame.payload)
    with contextlib.suppress(lp.FramingError):
        lp.salvage_reply(data)
    splitter = lp.LineSplitter()
    for line in splitter.feed(data) + splitter.feed(data[: len(data) // 2]):
        if line is not None and len(line) >= lp.MAX_LINE:
            raise AssertionError("the splitter returned an overlong line")


def _rtu_framer() -> object:
    from pymodbus.framer import FramerRTU
    from pymodbus.pdu import DecodePDU

    return FramerRTU(DecodePDU(False))  # the client's decoder: it reads replies


def _modbus(data: bytes) -> None:
    from pymodbus.exceptions import ModbusIOException

    framer = _rtu_framer()
    try:
        framer.handleFrame(data, 1, 0)  # type: ignore[attr-defined]
        framer.handleFrame(data, 0, 0)  # type: ignore[attr-defined]
    except ModbusIOException:
        pass  # "unable to decode": the driver reports it as a controller without a reply


@dataclass
class Target:
    name: str
    run: Callable[[bytes], None]
    corpus: Callable[[], list[bytes]]
    tried: int = 0
    failures: dict[str, str] = field(default_factory=dict)  # where -> first input

    def check(self, data: bytes) -> None:
        self.tried += 1
        try:
            self.run(data)
        except Exception as error:
            frame = traceback.extract_tb(error.__traceback__)[-1]
            where = f"{type(error).__name__} at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
            self.failures.setdefault(where, f"{data[:120]!r}: {error}"[:300])


def targets() -> list[Target]:
    return [
        Target("RESP3 codec", _resp3, lambda: _RESP3_CORPUS),
        Target("notification parser", _notification, lambda: _RESP3_CORPUS[-3:]),
        Target("HLC parser", _hlc, lambda: _HLC_CORPUS),
        Target("MQTT 5 packet codec", _mqtt, _mqtt_corpus),
        Target("controller line protocol", _line_protocol, lambda: _LINE_CORPUS),
        Target("Modbus RTU frames", _modbus, _modbus_corpus),
    ]


def fuzz(target: Target, inputs: int, seed_value: int) -> Target:
    """Runs ``inputs`` inputs through ``target`` (in batches drawn by hypothesis)."""
    examples = max(1, -(-inputs // BATCH))

    @seed(seed_value)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(mutated(target.corpus()), min_size=BATCH, max_size=BATCH))
    def run(batch: list[bytes]) -> None:
        for data in batch:
            target.check(data)

    run()
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=DEFAULT_INPUTS, help="inputs per parser")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--only", nargs="*", help="parsers whose name contains one of these")
    arguments = parser.parse_args(argv)
    chosen = [
        t
        for t in targets()
        if not arguments.only or any(o.lower() in t.name.lower() for o in arguments.only)
    ]
    print(f"{'parser':<26} {'inputs':>8} {'failures':>8} {'seconds':>8}  (target: 0 failures)")
    failed = False
    for target in chosen:
        started = time.perf_counter()
        fuzz(target, arguments.inputs, arguments.seed)
        elapsed = time.perf_counter() - started
        print(f"{target.name:<26} {target.tried:>8} {len(target.failures):>8} {elapsed:>8.1f}")
        for where, example in target.failures.items():
            print(f"    {where}: {example}")
        failed |= bool(target.failures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
