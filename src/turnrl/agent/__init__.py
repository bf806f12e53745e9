from turnrl.agent.chat import ChatRenderer

__all__ = ["ChatRenderer"]
