"""The psrl message bus: typed events over ZeroMQ, the run's proxies and its event log.

Spec: docs/protocol.md. Typical use by an actor::

    addresses = BusAddresses.load(run_dir)
    publisher = Publisher(ctx, addresses, sender="router", incarnation=0)
    publisher.wait_subscribed(timeout_s=10)
    publisher.publish(ActorStatus(ActorState.READY))
    control = Subscriber(ctx, addresses.control_out, kinds=["ctl."])
    events = Subscriber(ctx, addresses.events_out, kinds=["gen.", "wt."])
    inbox = Inbox([control, events])  # control first, always
    event = inbox.next(timeout_ms=100)
"""

from bus.addresses import BusAddresses, plan_addresses
from bus.codec import Decoder, Encoder
from bus.errors import BusError, DecodeError, DropReason, RequestTimeoutError
from bus.inbox import Inbox
from bus.proxy import BusProxy
from bus.publisher import Publisher
from bus.rpc import Replier, Request, Requester
from bus.schema import CATALOGUE, PROTOCOL_VERSION, Channel, Envelope, Event, Message, message
from bus.sockets import SocketOptions, make_socket
from bus.subscriber import Subscriber

__all__ = [
    "CATALOGUE",
    "PROTOCOL_VERSION",
    "BusAddresses",
    "BusError",
    "BusProxy",
    "Channel",
    "DecodeError",
    "Decoder",
    "DropReason",
    "Encoder",
    "Envelope",
    "Event",
    "Inbox",
    "Message",
    "Publisher",
    "Replier",
    "Request",
    "RequestTimeoutError",
    "Requester",
    "SocketOptions",
    "Subscriber",
    "make_socket",
    "message",
    "plan_addresses",
]
