"""The example's reward: partial credit for digit answers, full credit for an exact one.

psrl calls `digit_reward` with the arguments it names: `response` (the decoded response),
`answer` (the row's "answer" column) and `kind` (the row's "kind" column). It returns a dict:
`score` is the reward, `acc` is exact-match accuracy, and every other entry (here `length_gap`)
is averaged into a `reward/<name>` metric.
"""


def digit_reward(response: str, answer: str, kind: str) -> dict[str, float]:
    predicted = response.strip()
    if kind == "add":  # a sum's digits line up from the right
        predicted, answer = predicted[::-1], answer[::-1]
    longest = max(len(predicted), len(answer), 1)
    matching = sum(a == b for a, b in zip(predicted, answer, strict=False))
    return {
        "score": matching / longest,
        "acc": float(predicted == answer),
        "length_gap": float(abs(len(predicted) - len(answer))),
    }
