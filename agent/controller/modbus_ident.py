"""What a Modbus unit says of itself: report server id (function 17) and read device
identification (function 43, MEI type 14). Pure: requests built, replies checked.

Neither is needed to keep a unit in sync, and many units answer neither (an exception
reply, illegal function): a bus scan asks, to tell an operator what it found.
"""

from __future__ import annotations

from agent.controller.modbus_rtu import EXCEPTION_FLAG, ExceptionReply, FrameError, crc, frame

REPORT_SERVER_ID = 17
ENCAPSULATED = 43
READ_DEVICE_ID = 14
BASIC_IDENTIFICATION = 1
"""Read device id code 1: the basic objects, in one stream from the first asked."""
OBJECT_NAMES = {0: "vendor", 1: "product", 2: "revision", 3: "vendor url", 4: "product name"}
RUN_INDICATOR_ON = 0xFF


def server_id_request(unit_id: int) -> bytes:
    return frame(bytes((unit_id, REPORT_SERVER_ID)))


def device_id_request(unit_id: int, first_object: int = 0) -> bytes:
    return frame(bytes((unit_id, ENCAPSULATED, READ_DEVICE_ID, BASIC_IDENTIFICATION, first_object)))


def _checked(request: bytes, reply: bytes) -> ExceptionReply | None:
    if len(reply) < 5 or crc(reply) != 0:
        raise FrameError(f"a bad CRC or a reply cut short: {reply.hex(' ')}")
    if reply[0] != request[0]:
        raise FrameError(f"a reply from unit {reply[0]}, not {request[0]}")
    if reply[1] == request[1] | EXCEPTION_FLAG and len(reply) == 5:
        return ExceptionReply(reply[2])
    if reply[1] != request[1]:
        raise FrameError(f"a reply for function {reply[1]}, not {request[1]}")
    return None


def parse_server_id(request: bytes, reply: bytes) -> str | ExceptionReply:
    """The reply to function 17 as text: its printable runs, the run indicator shown."""
    refused = _checked(request, reply)
    if refused is not None:
        return refused
    data = reply[3:-2]
    if reply[2] != len(data):
        raise FrameError(f"{reply[2]} data bytes said, {len(data)} sent")
    words: list[str] = []
    run = bytearray()
    for byte in data:
        if 0x20 <= byte < 0x7F:
            run.append(byte)
            continue
        if run.strip():
            words.append(run.decode().strip())
        run.clear()
        if byte == RUN_INDICATOR_ON:
            words.append("(running)")
    if run.strip():
        words.append(run.decode().strip())
    return " ".join(words) or data.hex(" ")


def parse_device_id(request: bytes, reply: bytes) -> dict[int, str] | ExceptionReply:
    """The objects of a reply to function 43/14, by object id (0 vendor, 1 product code,
    2 revision, ...)."""
    refused = _checked(request, reply)
    if refused is not None:
        return refused
    body = reply[2:-2]
    if len(body) < 6 or body[0] != READ_DEVICE_ID:
        raise FrameError(f"not a device identification: {reply.hex(' ')}")
    count, index = body[5], 6
    objects: dict[int, str] = {}
    for _ in range(count):
        if index + 2 > len(body):
            raise FrameError(f"{count} objects said, fewer sent")
        object_id, length = body[index], body[index + 1]
        value = body[index + 2 : index + 2 + length]
        if len(value) != length:
            raise FrameError(f"object {object_id} cut short")
        objects[object_id] = value.decode("ascii", errors="replace")
        index += 2 + length
    return objects


def describe_device_id(objects: dict[int, str]) -> str:
    """As an operator reads it: `vendor SIM, product SIM-TSTAT, revision 1.0.0 SIM0003`."""
    return ", ".join(
        f"{OBJECT_NAMES.get(object_id, f'object {object_id}')} {text}"
        for object_id, text in sorted(objects.items())
    )
