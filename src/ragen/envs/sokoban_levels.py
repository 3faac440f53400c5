"""Sokoban levels: the seeded room generator and the shortest-solution solver.

Rooms are made in three pure steps from one `numpy.random.default_rng(seed)`:

1. carve: a random walk through a walled rectangle turns wall into floor;
2. place: targets and the player go on random floor cells, each box starts on its target;
3. reverse play: the player walks at random and *pulls* any box behind it. A pull is a push
   run backwards, so replaying the walk in reverse solves the room: every room is
   solvable by construction. Along the walk we keep the state whose boxes are all off the
   targets and farthest (Manhattan) from them.

`solve(room)` is a breadth-first search over (player, boxes) that returns a shortest action
list; the tests run it on every generated room and replay the answer to success.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

import numpy as np

from ragen.envs.base import GenerationError, check_int
from ragen.envs.sokoban_room import Room

MIN_SIDE, MAX_SIDE = 5, 32
# Bounds of the generator's effort: one try at the longest walks takes about 20 ms and
# draws its floats up front (under 1 MB), so even a room that cannot be made is given up
# within seconds; the defaults of a 32×32 room (carve 108, pull 7200 steps) are far below.
MAX_WALK_STEPS = 20_000
MAX_TRIES = 1000
TURN_PROB = 0.35  # chance per carving step that the digger changes direction
# Shapes the digger clears around its cell: mostly single cells and pairs, so rooms get
# corridors and a few open spots rather than one empty hall.
_BRUSHES = (
    ((0, 0),),
    ((0, 0),),
    ((0, 0), (0, 1)),
    ((0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0), (1, 1)),
)


def max_boxes(height: int, width: int) -> int:
    """The most boxes a room of this size accepts: each box needs a target and a free cell."""
    return ((height - 2) * (width - 2) - 1) // 2


def check_room_options(height: int, width: int, num_boxes: int) -> None:
    """ValueErrors that name the option and what is allowed."""
    check_int("height", height, MIN_SIDE, MAX_SIDE)
    check_int("width", width, MIN_SIDE, MAX_SIDE)
    check_int(f"num_boxes (for a {height}×{width} room)", num_boxes, 1, max_boxes(height, width))


def check_generator_options(
    carve_steps: int | None, pull_steps: int | None, max_tries: int
) -> None:
    """ValueErrors that name the option and what is allowed."""
    if carve_steps is not None:
        check_int("carve_steps", carve_steps, 1, MAX_WALK_STEPS)
    if pull_steps is not None:
        check_int("pull_steps", pull_steps, 1, MAX_WALK_STEPS)
    check_int("max_tries", max_tries, 1, MAX_TRIES)


# --------------------------------------------------------------------------- generator


@lru_cache(maxsize=64)
def _interior(height: int, width: int) -> bytes:
    """1 for every cell inside the wall border."""
    return bytes(
        0 < i // width < height - 1 and 0 < i % width < width - 1 for i in range(height * width)
    )


def _carve(u: Iterator[float], height: int, width: int, steps: int) -> bytearray:
    """Floor made by a random walk that stays inside the wall border.

    `u` yields uniform floats; drawing them in one numpy call per attempt (instead of one
    call per decision) is most of what makes generation fast.
    """
    inside = _interior(height, width)
    floor = bytearray(height * width)
    moves = (-width, width, -1, 1)
    brushes = tuple(tuple(r * width + c for r, c in brush) for brush in _BRUSHES)
    row = 1 + int(next(u) * (height - 2))
    col = 1 + int(next(u) * (width - 2))
    position, move = row * width + col, moves[int(next(u) * 4)]
    for _ in range(steps):
        if next(u) < TURN_PROB:
            move = moves[int(next(u) * 4)]
        if inside[position + move]:
            position += move
        for offset in brushes[int(next(u) * len(brushes))]:
            if inside[position + offset]:
                floor[position + offset] = 1
    return floor


def _displacement(boxes: list[int], targets: list[int], width: int) -> int:
    """Sum of Manhattan distances of each box from the target it started on."""
    total = 0
    for box, target in zip(boxes, targets, strict=True):
        b_row, b_col = divmod(box, width)
        t_row, t_col = divmod(target, width)
        total += abs(b_row - t_row) + abs(b_col - t_col)
    return total


def _pick_distinct(u: Iterator[float], cells: list[int], count: int) -> list[int]:
    """`count` different cells at random (a partial Fisher-Yates shuffle)."""
    cells = cells.copy()
    for k in range(count):
        j = k + int(next(u) * (len(cells) - k))
        cells[k], cells[j] = cells[j], cells[k]
    return cells[:count]


def _reverse_play(
    u: Iterator[float], floor: bytearray, width: int, num_boxes: int, steps: int
) -> tuple[list[int], list[int], int] | None:
    """Targets, boxes and player of the hardest-looking state of one random pulling walk.

    Returns None when no state of the walk has every box off the targets.
    """
    cells = [i for i, f in enumerate(floor) if f]
    *targets, player = _pick_distinct(u, cells, num_boxes + 1)
    target_set = set(targets)
    boxes = list(targets)  # box k starts on target k: the solved state
    moves = (-width, width, -1, 1)
    best_score, best_boxes, best_player = 0, None, player
    at_best = False
    for _ in range(steps):
        move = moves[int(next(u) * 4)]
        ahead = player + move
        if not floor[ahead] or ahead in boxes:
            continue
        behind = player - move
        if behind in boxes:
            # Pull: the box behind follows the player into the cell it leaves.
            boxes[boxes.index(behind)] = player
            player = ahead
            at_best = False
            if target_set.isdisjoint(boxes):
                score = _displacement(boxes, targets, width)
                if score > best_score:
                    best_score, best_boxes, best_player, at_best = score, boxes.copy(), player, True
        else:
            player = ahead
            if at_best:
                # Same boxes, the player wandered on: start it there, away from the box.
                best_player = player
    if best_boxes is None:
        return None
    return targets, best_boxes, best_player


def generate_room(
    seed: int,
    height: int = 6,
    width: int = 6,
    num_boxes: int = 1,
    *,
    carve_steps: int | None = None,
    pull_steps: int | None = None,
    max_tries: int = 100,
) -> Room:
    """A solvable room, the same for the same arguments on every machine.

    carve_steps: length of the digging walk (default 1.7 × (height + width), gym-sokoban's
        choice; larger rooms need longer walks).
    pull_steps: length of the reverse-play walk (default 8 × the interior area; longer
        walks give harder rooms, see benchmarks/envs.py).
    Raises GenerationError after `max_tries` failed attempts.
    """
    check_int("seed", seed, 0)
    check_room_options(height, width, num_boxes)
    check_generator_options(carve_steps, pull_steps, max_tries)
    if carve_steps is None:
        carve_steps = int(1.7 * (height + width))
    if pull_steps is None:
        pull_steps = 8 * (height - 2) * (width - 2)
    rng = np.random.default_rng(seed)
    # Upper bound on the floats one attempt uses: 3 + 2 per carving step + 1 per brush,
    # one per picked cell, one per pulling step.
    draws = 3 + 3 * carve_steps + num_boxes + 1 + pull_steps
    for _ in range(max_tries):
        u = iter(rng.random(draws).tolist())
        floor = _carve(u, height, width, carve_steps)
        if floor.count(1) < 2 * num_boxes + 1:
            continue
        found = _reverse_play(u, floor, width, num_boxes, pull_steps)
        if found is not None:
            targets, boxes, player = found
            return Room(height, width, bytes(floor), frozenset(targets), frozenset(boxes), player)
    raise GenerationError(
        f"no {height}×{width} room with {num_boxes} box(es) after max_tries={max_tries} "
        "attempts; use fewer boxes, a larger room, or more carve_steps"
    )


# --------------------------------------------------------------------------- solver


def _dead_cells(room: Room) -> frozenset[int]:
    """Floor corners that are not targets: a box pushed there can never move again."""
    w, floor = room.width, room.floor
    dead = set()
    for i, f in enumerate(floor):
        if not f or i in room.targets:
            continue
        blocked_vertical = not floor[i - w] or not floor[i + w]
        blocked_horizontal = not floor[i - 1] or not floor[i + 1]
        if blocked_vertical and blocked_horizontal:
            dead.add(i)
    return frozenset(dead)


def _path(parents: dict, state: tuple) -> list[str]:
    moves = []
    while parents[state] is not None:
        state, move = parents[state]
        moves.append(move)
    return moves[::-1]


def solve(room: Room, max_states: int = 2_000_000) -> list[str] | None:
    """A shortest action list that solves `room`, or None if it cannot be solved.

    Breadth-first over (player, sorted boxes), so the first solution found is shortest in
    actions. Pushing a box into a non-target corner is pruned (it can never be solved
    from there), which keeps the search small without losing optimality.
    Raises RuntimeError if more than `max_states` states were needed.
    """
    if room.solved:
        return []
    floor, targets, dead = room.floor, room.targets, _dead_cells(room)
    moves = tuple(room.offsets().items())
    start = (room.player, tuple(sorted(room.boxes)))
    parents: dict[tuple, tuple | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for state in frontier:
            player, boxes = state
            for name, step in moves:
                ahead = player + step
                if not floor[ahead]:
                    continue
                pushed = ahead in boxes
                if pushed:
                    beyond = ahead + step
                    if not floor[beyond] or beyond in boxes or beyond in dead:
                        continue
                    boxes_after = tuple(sorted(beyond if b == ahead else b for b in boxes))
                else:
                    boxes_after = boxes
                child = (ahead, boxes_after)
                if child in parents:
                    continue
                parents[child] = (state, name)
                if pushed and targets.issuperset(boxes_after):
                    return _path(parents, child)
                following.append(child)
        if len(parents) > max_states:
            raise RuntimeError(f"solve gave up after {max_states} states")
        frontier = following
    return None
