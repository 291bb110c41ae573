//! `acp`: any Agent Client Protocol agent over stdio.

use pedelec_protocol::{ErrorCode, pb};

use super::{Provider, ProviderConfig, ProviderFailure, ProviderSession, ProviderSetup, program_info};

pub struct Acp {
    config: ProviderConfig,
}

impl Acp {
    pub fn new(config: ProviderConfig) -> Self {
        Acp { config }
    }
}

impl Provider for Acp {
    fn code(&self) -> String {
        self.config.code.clone()
    }

    fn info(&self) -> pb::ProviderInfo {
        program_info(&self.config)
    }

    fn default_model(&self) -> String {
        self.config.model.clone().unwrap_or_default()
    }

    fn start(&self, _setup: ProviderSetup) -> Result<Box<dyn ProviderSession>, ProviderFailure> {
        Err(ProviderFailure::coded(ErrorCode::ProviderUnavailable, "the acp adapter is not built yet", true))
    }
}
