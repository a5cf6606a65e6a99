"""Per-device memory of a stage (or of a layer's operators), split by what the bytes are for."""

from __future__ import annotations

import dataclasses

from alpaviz.core.graph import check_int, check_number


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device: state for the whole step, activations per microbatch, the largest operator's working set.

    `in_flight` is how many microbatches' activations the schedule keeps at
    once (1F1B stage i of n: n - i; GPipe: all), so the predicted peak is
    `params + optimizer_state + gradients + in_flight * activations + temporaries`.

    Example:
        >>> stage.cost.memory.peak, stage.cost.memory.activations
    """

    params: float = 0.0
    optimizer_state: float = 0.0
    gradients: float = 0.0
    activations: float = 0.0
    temporaries: float = 0.0
    in_flight: int = 1

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name == "in_flight":
                check_int("memory in_flight", self.in_flight, minimum=0)
            else:
                check_number(f"memory {field.name}", getattr(self, field.name), minimum=0, allow_inf=True)

    @property
    def state(self) -> float:
        """What lives the whole step: parameters, optimizer state and gradients (or their accumulators)."""
        return self.params + self.optimizer_state + self.gradients

    @property
    def peak(self) -> float:
        """Peak bytes per device: state, plus activations times microbatches in flight, plus temporaries."""
        return self.state + self.in_flight * self.activations + self.temporaries

    def __add__(self, other: "MemoryBreakdown") -> "MemoryBreakdown":
        """Two layers of one stage: the state and activations add, the working sets do not (one op runs at a time)."""
        return MemoryBreakdown(
            self.params + other.params, self.optimizer_state + other.optimizer_state,
            self.gradients + other.gradients, self.activations + other.activations,
            max(self.temporaries, other.temporaries), max(self.in_flight, other.in_flight),
        )

    def with_in_flight(self, in_flight: int) -> "MemoryBreakdown":
        """The same breakdown with `in_flight` microbatches' activations held, as a schedule holds them."""
        return dataclasses.replace(self, in_flight=in_flight)
