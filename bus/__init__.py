"""The psrl message bus: typed events over ZeroMQ, the run's proxies, links and its event log.

The bus is the bottom layer: it imports nothing of psrl or the actors. Spec: docs/protocol.md.
Typical use by an actor::

    addresses = BusAddresses.load(run_dir)
    publisher = Publisher(ctx, addresses, sender="router", incarnation=0)
    publisher.wait_subscribed(timeout_s=10)
    publisher.publish(ActorStatus(ActorState.READY))
    control = Subscriber(ctx, addresses.control_out, kinds=["ctl."])
    events = Subscriber(ctx, addresses.events_out, kinds=["gen.", "wt."])
    inbox = Inbox([control, events])  # control first, always
    event = inbox.next(timeout_ms=100)
    link = Link(ctx, "ipc:///run/router.sock", sender="coordinator-router", serve=False,
                identity="coordinator", log=publisher)  # what it sends is logged too
    link.send(Consume(buffer=0, trainer_version=0))
"""

from bus.addresses import BusAddresses, plan_addresses
from bus.codec import Decoder, Encoder
from bus.errors import BusError, DecodeError, DropReason
from bus.inbox import Inbox
from bus.link import Link
from bus.proxy import BusProxy
from bus.publisher import Publisher
from bus.schema import CATALOGUE, PROTOCOL_VERSION, Channel, Envelope, Event, Message, message
from bus.sockets import SocketOptions, make_socket
from bus.stamp import Cause
from bus.subscriber import Subscriber

__all__ = [
    "CATALOGUE",
    "PROTOCOL_VERSION",
    "BusAddresses",
    "BusError",
    "BusProxy",
    "Cause",
    "Channel",
    "DecodeError",
    "Decoder",
    "DropReason",
    "Encoder",
    "Envelope",
    "Event",
    "Inbox",
    "Link",
    "Message",
    "Publisher",
    "SocketOptions",
    "Subscriber",
    "make_socket",
    "message",
    "plan_addresses",
]
