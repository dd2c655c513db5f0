"""Cross-mesh resharding (Zhuang et al., arXiv 2211.05322): layouts, unit tasks,
strategies, a lower bound, and a numpy executor that proves plans deliver."""
from .api import Result, best_transfer, cluster_network
from .bound import Bound, lower_bound
from .cost import Network, default_network, network_from_cluster
from .layout import Layout, dtype_bytes, parse_layout, parse_mesh, parse_shape
from .strategies import Plan, Transfer
from .tasks import UnitTask, make_tasks

__all__ = ["Result", "best_transfer", "cluster_network", "Bound", "lower_bound", "Network", "default_network",
           "network_from_cluster", "Layout", "dtype_bytes", "parse_layout", "parse_mesh", "parse_shape", "Plan",
           "Transfer", "UnitTask", "make_tasks"]
