from tests.unit.transport.sockets import close_opened_sockets

__all__ = ["close_opened_sockets"]
