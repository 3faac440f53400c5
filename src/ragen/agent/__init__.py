"""What the agent reads and writes: the dialogue prompts and the reply parser.

For example, with `env = ragen.envs.make("sokoban")`:

from ragen.agent import first_user_message, parse_reply, reply_prefix
text = first_user_message(env.instructions(), env.actions, 3, env.reset(0), 10)
parsed = parse_reply("<think>...</think><answer>Up || Left</answer>", env.actions, 3)
parsed.actions, parsed.format_ok, parsed.problems
"""

from ragen.agent.parsing import FATAL, PROBLEMS, Parsed, parse_reply
from ragen.agent.prompts import (
    SYSTEM_PROMPT,
    example_reply,
    first_user_message,
    format_rule,
    reply_prefix,
    turn_user_message,
    worked_reply,
)

__all__ = [
    "FATAL",
    "PROBLEMS",
    "SYSTEM_PROMPT",
    "Parsed",
    "example_reply",
    "first_user_message",
    "format_rule",
    "parse_reply",
    "reply_prefix",
    "turn_user_message",
    "worked_reply",
]
