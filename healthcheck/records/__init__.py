"""How a job ended, as this tool records it: class names and the AdminComment entry format."""
