"""TITO (token in, token out): a session's exact tokens, turn by turn, never re-tokenised.

A session holds trajectories (``TokenTranscript``): token sequences the engine saw and produced. A call
carries the whole conversation; it is placed by its messages, not its text:

* **continue**: its messages start with a trajectory's last turn (that turn's request messages
  plus the assistant reply the gateway returned; tool-call ids aside). The next prompt is that
  trajectory's exact tokens followed by the tokens of the new messages only (``_delta``).
* **recorded**: its messages equal a turn's request messages: the turn's reply is answered again
  (a retried call, or the first turn generated ahead of the call), so no turn is applied twice.
* **branch**: anything else (the client edited, truncated or summarised its history). A new
  trajectory starts from the longest history of an existing turn the messages still start with
  (its exact tokens, then the delta), or, when none, from the full rendering; both trajectories
  are kept and ``branch_of`` / ``branch_at`` record the longest common token prefix.

The new messages' tokens (``_delta``): the template renders the earlier history (``P``, ending
with the template's close of the last assistant turn, e.g. ``<|im_end|>\\n``) and the whole
conversation with the generation prompt (``F``). The close is cut from ``P``; ``F`` must extend
what is left, except that up to ``max_trim_tokens`` tokens at its end may be rendered differently
(boundary re-rendering: a template that formats the last assistant turn otherwise once a message
follows); more is a ``TitoError`` naming the session and turn. The delta is ``F`` after the common
text, less the part of the close the model generated itself (its stop token). Tokens are encoded
with special tokens recognised and none added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from psrl.gateway.chat_templates import ChatTemplate
from psrl.gateway.messages import starts_with

Encode = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]  # special tokens kept
_SENTINEL = "\x00psrl-close\x00"


class TitoError(ValueError):
    """The conversation cannot be continued without re-tokenising more than the trim rule allows."""


@dataclass
class Turn:
    messages: list[dict[str, Any]]  # the request's messages (canonical)
    prompt_len: int  # tokens of the trajectory before this turn's generation
    generated: list[int]
    reply: dict[str, Any]  # the assistant message returned (canonical)
    finish_reason: str = "stop"
    logprobs: list[float] | None = None  # the generated tokens' log-probs, where the generator gives them
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: the likeliest (token, log-prob)

    @property
    def history(self) -> list[dict[str, Any]]:
        return [*self.messages, self.reply]


@dataclass
class TokenTranscript:
    tokens: list[int]  # exact: every prompt's new tokens and every generated token, in order
    tools: list[dict[str, Any]]
    turns: list[Turn] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1 for generated tokens
    branch_of: int = -1  # the trajectory it branched from (-1: none)
    branch_at: int = 0  # tokens it shares with it


@dataclass(frozen=True)
class Plan:
    kind: Literal["continue", "recorded", "branch"]
    trajectory: int  # index of the trajectory (a branch: the one it is to become)
    turn: int  # index of the turn in that trajectory
    messages: list[dict[str, Any]]
    new_tokens: list[int]  # appended to the trajectory's tokens before generating (recorded: none)
    base: list[int]  # the trajectory's tokens before them (a branch: its shared prefix)
    tools: list[dict[str, Any]] = field(default_factory=list)
    branch_of: int = -1
    trimmed: int = 0

    @property
    def prompt(self) -> list[int]:
        return [*self.base, *self.new_tokens]


class TitoSession:
    def __init__(
        self,
        session_id: str,
        template: ChatTemplate,
        encode: Encode,
        decode: Decode,
        max_trim_tokens: int = 0,
        text: Decode | None = None,
    ) -> None:
        self.session_id = session_id
        self.template, self.encode, self.decode = template, encode, decode
        self.max_trim_tokens = max_trim_tokens
        self.text = text or decode  # special tokens dropped: what a text completion's client reads
        self.trajectories: list[TokenTranscript] = []
        self._close: str | None = None

    # ------------------------------------------------------------------ placing a call

    def plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Plan:
        found = self._recorded(messages, tools)
        if found is not None:
            return found
        index, turn = self._deepest(messages, tools)
        if index >= 0 and turn == len(self.trajectories[index].turns) - 1:
            traj = self.trajectories[index]
            delta, trimmed = self._delta(traj.turns[turn], messages, tools, turn + 1)
            return Plan("continue", index, turn + 1, messages, delta, list(traj.tokens), tools, trimmed=trimmed)
        return self._branch(messages, tools, index, turn)

    def plan_text(self, prompt: str) -> Plan:
        """A text completion's prompt: it continues a trajectory whose text (special tokens aside) it
        extends, else branches."""
        for index, traj in enumerate(self.trajectories):
            done = self.text(traj.tokens)
            if prompt.startswith(done) and len(prompt) > len(done):
                new = self.encode(prompt[len(done) :])
                return Plan("continue", index, len(traj.turns), [], new, list(traj.tokens))
            for number, turn in enumerate(traj.turns):
                if self.text(traj.tokens[: turn.prompt_len]) == prompt:
                    return Plan("recorded", index, number, [], [], traj.tokens[: turn.prompt_len])
        tokens = self.encode(prompt)
        parent, shared = self._longest_prefix(tokens)
        return Plan("branch", len(self.trajectories), 0, [], tokens[shared:], tokens[:shared], branch_of=parent)

    def _recorded(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Plan | None:
        for index, traj in enumerate(self.trajectories):
            for number, turn in enumerate(traj.turns):
                if traj.tools == tools and len(turn.messages) == len(messages) and starts_with(messages, turn.messages):
                    return Plan("recorded", index, number, messages, [], traj.tokens[: turn.prompt_len], tools)
        return None

    def _deepest(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[int, int]:
        """The trajectory and turn with the longest history ``messages`` start with (-1, -1: none)."""
        best, best_len = (-1, -1), 0
        for index in reversed(range(len(self.trajectories))):
            traj = self.trajectories[index]
            if traj.tools != tools:
                continue
            for number in reversed(range(len(traj.turns))):
                history = traj.turns[number].history
                if len(history) < len(messages) and len(history) > best_len and starts_with(messages, history):
                    best, best_len = (index, number), len(history)
                    break
        return best

    def _branch(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], index: int, turn: int) -> Plan:
        number = len(self.trajectories)
        if index < 0:
            tokens = self.encode(self.template.render(messages, tools, True))
            parent, shared = self._longest_prefix(tokens)
            return Plan("branch", number, 0, messages, tokens[shared:], tokens[:shared], tools, branch_of=parent)
        source = self.trajectories[index]
        base = source.tokens[: source.turns[turn].prompt_len + len(source.turns[turn].generated)]
        delta, trimmed = self._delta(source.turns[turn], messages, tools, turn + 1)
        return Plan("branch", number, turn + 1, messages, delta, base, tools, branch_of=index, trimmed=trimmed)

    def _longest_prefix(self, tokens: list[int]) -> tuple[int, int]:
        best = (-1, 0)
        for index, traj in enumerate(self.trajectories):
            shared = _common(traj.tokens, tokens)
            if shared > best[1]:
                best = (index, shared)
        return best

    def prompt_mask(self, plan: Plan) -> list[int]:
        """The loss mask of a plan's prompt as the trajectory it goes on records it (1: generated)."""
        if plan.kind == "continue" and plan.trajectory < len(self.trajectories):
            base = self.trajectories[plan.trajectory].loss_mask[: len(plan.base)]
        elif plan.kind == "branch" and plan.branch_of >= 0:
            base = self.trajectories[plan.branch_of].loss_mask[: len(plan.base)]
        else:
            base = [0] * len(plan.base)
        return [*base, *([0] * len(plan.new_tokens))]

    # ------------------------------------------------------------------ the new messages' tokens

    def close(self) -> str:
        """What the template writes after an assistant message's content (``<|im_end|>\\n`` for ChatML)."""
        if self._close is None:
            probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
            text = self.template.render(probe, None, False)
            self._close = text.split(_SENTINEL, 1)[1] if _SENTINEL in text else ""
        return self._close

    def _delta(
        self, last: Turn, messages: list[dict[str, Any]], tools: list[dict[str, Any]], number: int
    ) -> tuple[list[int], int]:
        close = self.close()
        earlier = self.template.render(last.history, tools, False)
        if close and earlier.endswith(close):
            earlier = earlier[: -len(close)]
        full = self.template.render(messages, tools, True)
        common = _common(earlier, full)
        trimmed = len(self.encode(earlier[common:])) if common < len(earlier) else 0
        if trimmed > self.max_trim_tokens:
            raise TitoError(
                f"session {self.session_id} turn {number}: the chat template renders the earlier conversation "
                f"differently ({trimmed} tokens from character {common}; max_trim_tokens={self.max_trim_tokens})"
            )
        rest = full[common:]
        generated = self.decode(last.generated)
        return self.encode(rest[_own_close(generated, close, rest) :]), trimmed

    # ------------------------------------------------------------------ recording

    def record(
        self,
        plan: Plan,
        generated: list[int],
        reply: dict[str, Any],
        finish_reason: str,
        logprobs: list[float] | None = None,
    ) -> Turn:
        """Apply a continue or branch plan with the engine's answer; the new turn."""
        if plan.kind == "branch":
            traj = TokenTranscript(list(plan.base), plan.tools, branch_of=plan.branch_of, branch_at=len(plan.base))
            source = self.trajectories[plan.branch_of] if plan.branch_of >= 0 else None
            traj.turns = source.turns[: plan.turn] if source is not None else []
            traj.loss_mask = source.loss_mask[: len(plan.base)] if source is not None else [0] * len(plan.base)
            self.trajectories.append(traj)
        traj = self.trajectories[plan.trajectory]
        prompt_len = len(traj.tokens) + len(plan.new_tokens)
        turn = Turn(plan.messages, prompt_len, list(generated), reply, finish_reason, logprobs)
        traj.tokens += [*plan.new_tokens, *generated]
        traj.loss_mask += [0] * len(plan.new_tokens) + [1] * len(generated)
        traj.turns.append(turn)
        return turn

    def seed(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        prompt: list[int],
        generated: list[int],
        reply: dict[str, Any],
        finish_reason: str,
        logprobs: list[float] | None = None,
    ) -> Turn:
        """A first turn generated before any call (the run's prompt path): trajectory 0."""
        traj = TokenTranscript(list(prompt), tools, loss_mask=[0] * len(prompt))
        self.trajectories.append(traj)
        plan = Plan("continue", 0, 0, messages, [], list(prompt), tools)
        return self.record(plan, generated, reply, finish_reason, logprobs)


def _own_close(generated: str, close: str, rest: str) -> int:
    """How much of the template's close the model wrote itself (its stop token): not written twice."""
    for k in range(len(close), 0, -1):
        if generated.endswith(close[:k]) and rest.startswith(close[:k]):
            return k
    return 0


def _common(a: Any, b: Any) -> int:
    """Length of the longest common prefix of two sequences (strings or token lists)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
