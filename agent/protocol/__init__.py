"""The state store wire protocol: pure functions and types, no I/O.

- `hlc`: hybrid logical clock timestamps (versions and fencing tokens).
- `resp3`: the RESP3 subset carried in request, response and notification payloads.
- `topics`: MQTT topics and properties the protocol names.
- `errors`: the service's error texts.
"""
