"""Math environment: generated multi-step arithmetic word problems or GSM8K / MATH files,
answer extraction and exact checking (see envs/math/README.md)."""

from agentgym.envs.math.env import MathEnv
from agentgym.envs.math.problems import Problem, generate_problem, load_problems

__all__ = ["MathEnv", "Problem", "generate_problem", "load_problems"]
