"""Data contracts shared by the trainer, the services and their clients (pydantic v2 models).

Client and server import the same models, so the wire format cannot drift between them.
"""

from agentevolver.schema.env_wire import (
    DEFAULT_SHAPE,
    SHAPE_PARAM,
    SHAPES,
    CreateData,
    CreateRequest,
    EnvRequest,
    EnvResponse,
    EvaluateRequest,
    InstanceInfo,
    InstanceRequest,
    ProfileRequest,
    Shape,
    StepData,
    StepRequest,
)
from agentevolver.schema.error import ErrorDetail
from agentevolver.schema.message import ChatMessage, ToolCall, ToolFunction
from agentevolver.schema.sample import Sample
from agentevolver.schema.task import Task, TaskObjective
from agentevolver.schema.trajectory import Reward, Trajectory

__all__ = [
    "DEFAULT_SHAPE",
    "SHAPES",
    "SHAPE_PARAM",
    "ChatMessage",
    "CreateData",
    "CreateRequest",
    "EnvRequest",
    "EnvResponse",
    "ErrorDetail",
    "EvaluateRequest",
    "InstanceInfo",
    "InstanceRequest",
    "ProfileRequest",
    "Reward",
    "Sample",
    "Shape",
    "StepData",
    "StepRequest",
    "Task",
    "TaskObjective",
    "ToolCall",
    "ToolFunction",
    "Trajectory",
]
