"""Integrations of fusee with other libraries, each behind its own extra.

- `fusee.contrib.pydantic_ai` (``pip install "fusee[pydantic-ai]"``): a
  pydantic-ai ``Agent`` run durably inside a workflow.
- `fusee.contrib.openai_agents` (``pip install "fusee[openai-agents]"``): the
  OpenAI Agents SDK's ``Runner`` run durably inside a workflow.

The rule: a module here imports fusee's public names only (it sits above the
engine and the client), and its library only where the library says its
API is public.
"""
