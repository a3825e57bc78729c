"""Request-body schemas for routes that read their raw body, so `/openapi.json` describes them.

The inference routes parse bytes themselves (the wire modules decide every field and answer in
the client's dialect), so FastAPI cannot infer their bodies. These schemas document the fields
Reef supports (docs/wire.md) for clients and for the fuzz tests; they change no behaviour: a
field absent here is still ignored or refused exactly as docs/wire.md says.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

JSON = dict[str, Any]


def json_body(schema: JSON, description: str) -> JSON:
    """`openapi_extra` for a route whose body is JSON of `schema`."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": schema}},
        }
    }


def model_body(model: type[BaseModel], description: str) -> JSON:
    return json_body(model.model_json_schema(), description)


_STRING = {"type": "string"}
_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": _STRING},
}
_TEXT_OR_PARTS = {"anyOf": [_STRING, {"type": "array", "items": _TEXT_PART}]}
_PARAMETERS = {"type": "object", "description": "a JSON schema of the tool's arguments"}

OPENAI_CHAT: JSON = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                    "content": {"anyOf": [_STRING, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]},
                    "name": _STRING,
                    "tool_call_id": _STRING,
                    "tool_calls": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["id", "type", "function"],
                            "properties": {
                                "id": _STRING,
                                "type": {"type": "string", "enum": ["function"]},
                                "function": {
                                    "type": "object",
                                    "required": ["name", "arguments"],
                                    "properties": {"name": _STRING, "arguments": _STRING},
                                },
                            },
                        },
                    },
                },
            },
        },
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "function"],
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "function": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": _STRING, "description": _STRING, "parameters": _PARAMETERS},
                    },
                },
            },
        },
        "tool_choice": {
            "anyOf": [
                {"type": "string", "enum": ["none", "auto", "required"]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"type": "string", "enum": ["function"]},
                        "function": {"type": "object", "required": ["name"], "properties": {"name": _STRING}},
                    },
                },
            ]
        },
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "stop": {"anyOf": [_STRING, {"type": "array", "maxItems": 4, "items": {"type": "string", "minLength": 1}}]},
        "n": {"type": "integer", "enum": [1]},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "seed": {"type": "integer"},
    },
}

_NAME = {"type": "string", "minLength": 1}
_RESPONSES_TEXT_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["input_text", "output_text"]}, "text": _STRING},
}
_RESPONSES_INPUT_ITEM = {
    "anyOf": [
        {
            "type": "object",
            "required": ["role", "content"],
            "properties": {
                "type": {"type": "string", "enum": ["message"]},
                "role": {"type": "string", "enum": ["user", "system", "developer", "assistant"]},
                "content": {"anyOf": [_STRING, {"type": "array", "items": _RESPONSES_TEXT_PART}]},
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "name", "arguments"],
            "properties": {
                "type": {"type": "string", "enum": ["function_call"]},
                "call_id": _NAME,
                "name": _NAME,
                "arguments": _STRING,
            },
        },
        {
            "type": "object",
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"type": "string", "enum": ["function_call_output"]},
                "call_id": _NAME,
                "output": {"anyOf": [_STRING, {"type": "array", "items": _RESPONSES_TEXT_PART}]},
            },
        },
    ]
}

OPENAI_RESPONSES: JSON = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "minLength": 1},
        "input": {"anyOf": [_STRING, {"type": "array", "minItems": 1, "items": _RESPONSES_INPUT_ITEM}]},
        "instructions": _STRING,
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "name"],
                "properties": {
                    "type": {"type": "string", "enum": ["function"]},
                    "name": _NAME,
                    "description": _STRING,
                    "parameters": _PARAMETERS,
                    "strict": {"type": "boolean"},
                },
            },
        },
        "tool_choice": {
            "anyOf": [
                {"type": "string", "enum": ["none", "auto", "required"]},
                {
                    "type": "object",
                    "required": ["type", "name"],
                    "properties": {"type": {"type": "string", "enum": ["function"]}, "name": _NAME},
                },
            ]
        },
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
    },
}

_ANTHROPIC_FIELDS: JSON = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "messages": {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["user", "assistant"]}, "content": _TEXT_OR_PARTS},
        },
    },
    "system": _TEXT_OR_PARTS,
    "tools": {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name", "input_schema"],
            "properties": {"name": _STRING, "description": _STRING, "input_schema": _PARAMETERS},
        },
    },
    "tool_choice": {
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"type": "string", "enum": ["auto", "none", "any", "tool"]}, "name": _STRING},
    },
    "stop_sequences": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "stream": {"type": "boolean"},
}

ANTHROPIC_MESSAGES: JSON = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": _ANTHROPIC_FIELDS,
}

ANTHROPIC_COUNT_TOKENS: JSON = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {k: v for k, v in _ANTHROPIC_FIELDS.items() if k not in ("max_tokens", "stream")},
}
