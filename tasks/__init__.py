"""seqio tasks and mixtures of flax_xalign (installed as flax_xalign.tasks).

Importing this package registers the embedded Bible tasks (no data is read and
no vocabulary is trained until a dataset is built) and exposes the helpers the
trainer uses: `resolve` (provider, languages, vocabulary of a name; plain seqio
tasks and mixtures included), `languages_of`, `get_vocabulary`, `get_provider`,
and `describe` / `register_described` (re-register a run's tasks elsewhere).
"""

from . import registry
from . import bible
from . import user
from . import code_switch
from . import tfds
from . import debian
from .registry import describe
from .registry import get_provider
from .registry import get_vocabulary
from .registry import languages_of
from .registry import register_described
from .registry import registered_names
from .registry import resolve
from .registry import task_names
